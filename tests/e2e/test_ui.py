"""`ablate ui` and `ablate server`: real MLflow servers, real HTTP requests, real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ablate.core.processes import process_table
from ablate.store import names
from ablate.store.stores import Stores
from ablate.train.launch import free_port

HANG_GUARD = 120  # seconds: a hang guard only; stopping takes seconds, even on a loaded machine


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid`, read from /proc (parent links), whatever its process group."""
    parents = {child: int(ppid) for child, (state, ppid, *_) in process_table().items() if state != "Z"}
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _port_free(port: int) -> bool:
    """No one listens on `port`: a new server could bind it (connections of the old one in TIME_WAIT do not
    count, as for any server that sets SO_REUSEADDR, uvicorn included)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _read_until(proc: subprocess.Popen, pattern: str, timeout: float = 120) -> tuple[re.Match, str]:
    """Lines of `proc`'s output until one matches `pattern` (the output so far, for the failure message)."""
    seen, deadline = "", time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"exited {proc.wait()} before printing {pattern!r}:\n{seen}")
        seen += line
        match = re.search(pattern, line)
        if match:
            return match, seen
    raise AssertionError(f"no {pattern!r} within {timeout} s:\n{seen}")


def _get(url: str, data: dict | None = None) -> str:
    body = None if data is None else json.dumps(data).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 (a local test server)
        return answer.read().decode()


def _sigterm_stops_everything(proc: subprocess.Popen, port: int) -> None:
    _signal_stops_everything(proc, port, signal.SIGTERM)


def _signal_stops_everything(proc: subprocess.Popen, port: int, signum: int) -> None:
    """`signum` to the ablate process only (as `kill PID` does; Ctrl-C's SIGINT reaches only ablate too,
    MLflow runs in a session of its own): it exits 0, and by then every process below it is gone and the
    port is free (ablate waits for MLflow's whole process group before it exits). The waits are for those
    events; their clocks are hang guards, far above the seconds this takes on a loaded machine."""
    children = _descendants(proc.pid)
    assert children, "the MLflow server runs in child processes; none found"
    start = time.monotonic()
    proc.send_signal(signum)
    assert proc.wait(timeout=HANG_GUARD) == 0
    took = time.monotonic() - start
    # orphans reparented to init are reaped asynchronously: wait for that, not for a deadline
    guard = time.monotonic() + HANG_GUARD
    while time.monotonic() < guard and (any(_alive(pid) for pid in children) or not _port_free(port)):
        time.sleep(0.05)
    name = signal.Signals(signum).name
    assert not [pid for pid in children if _alive(pid)], f"processes left running after {name} ({took:.1f} s)"
    assert _port_free(port), f"port {port} still bound after {name} ({took:.1f} s)"


def _sigint_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT's default action, as a terminal's foreground process has it. A
    suite started in the background by a non-interactive shell inherits SIGINT ignored, and Python keeps
    an ignored SIGINT ignored (no KeyboardInterrupt): Ctrl-C would then be tested on a process that
    cannot receive it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(verb: str, workspace: Path, port: int, *more: str, **popen) -> subprocess.Popen:
    """`ablate ui` or `ablate server` on `workspace`, its output read through a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "ablate.cli", verb, "--workspace", str(workspace), "--port", str(port), *more],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
        **popen,
    )


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to `ablate ui`/`server` (it stops its MLflow child), and SIGKILL to its whole group if it
    has not exited within a minute."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _start_ui(workspace: Path, port: int) -> subprocess.Popen:
    return _start("ui", workspace, port, preexec_fn=_sigint_as_in_a_terminal)


@pytest.mark.slow
def test_ui_prints_one_link_the_comparison_of_a_finished_sweep(finished_sweep):
    client = Stores(finished_sweep).client()
    experiment = client.get_experiment_by_name("mini")
    finished = {
        r.info.run_id
        for r in client.search_runs([experiment.experiment_id])
        if r.data.tags.get("ablate.role") != "sweep" and r.info.status == "FINISHED"
    }
    assert len(finished) == 4
    # MLflow 3 opens an experiment as a training experiment only with this tag
    assert experiment.tags[names.EXPERIMENT_KIND] == "custom_model_development"

    port = free_port()
    proc = _start_ui(finished_sweep, port)
    try:
        match, seen = _read_until(proc, r"MLflow UI: (\S+)")
        url = match.group(1)
        assert url == (
            f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}/runs"
            "?workflowType=machine_learning&viewStateShareKey=ablate-comparison&compareRunsMode=CHART"
        )
        assert seen.count("http://") == 1, seen  # one link, printed once the server answers
        base, route = url.split("/#", 1)
        assert "<html" in _get(base + "/").lower()  # the single-page app that routes `route`
        # The view the link names, as the page reads it: the experiment's tag, served by this server.
        answer = json.loads(
            _get(f"{base}/api/2.0/mlflow/experiments/get?experiment_id={experiment.experiment_id}")
        )
        tags = {t["key"]: t["value"] for t in answer["experiment"]["tags"]}
        view = json.loads(tags["mlflow.sharedViewState.ablate-comparison"])
        assert view["selectedColumns"][:3] == [
            "metrics.`val/loss`",
            "metrics.`val/ar_hit`",
            "metrics.`val/others`",
        ]
        assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "ablate.variant"}]
        # Every variant's group expanded, and MLflow's group of the runs without a variant (the parent).
        assert set(view["groupsExpanded"]) == {
            "tag.ablate.variant.transformer",
            "tag.ablate.variant.diff",
            "tag.ablate.variant",
        }
        shown = [c for c in view["compareRunCharts"] if not c["deleted"]]
        # First the parent run's paired differences (mean, low, high), then the metrics against tokens.
        assert [c.get("selectedMetricKeys") for c in shown][:3] == [
            [f"diff/{m}/diff/{end}" for end in ("mean", "low", "high")]
            for m in ("val/loss", "val/ar_hit", "val/others")
        ]
        assert [c["metricKey"] for c in shown][3:6] == [
            "tokens/val/loss",
            "tokens/val/ar_hit",
            "tokens/val/others",
        ]
        # A metric with one value in every run (the share of AR-Hit tokens in one validation set) is left out.
        deleted = {c["metricKey"] for c in view["compareRunCharts"] if c["deleted"]}
        assert {"val/ar_hit_share", "tokens/val/ar_hit_share"} <= deleted
        # Each row's runs in its colour: its place in the recipe, the report plots' palette.
        colors = {
            (r.data.tags["ablate.variant"], r.data.tags.get("mlflow.runColor"))
            for r in client.search_runs([experiment.experiment_id], "tags.`ablate.run_key` LIKE '%'")
        }
        assert colors == {("transformer", "#1f77b4"), ("diff", "#ff7f0e")}
        # The runs that view's filter selects: every finished trial and the sweep's parent run.
        answer = json.loads(
            _get(
                f"{base}/api/2.0/mlflow/runs/search",
                {
                    "experiment_ids": [experiment.experiment_id],
                    "filter": view["searchFilter"],
                    "max_results": 100,
                },
            )
        )
        parent = {
            r.info.run_id
            for r in client.search_runs([experiment.experiment_id], "tags.`ablate.role` = 'sweep'")
        }
        assert {r["info"]["run_id"] for r in answer["runs"]} == finished | parent
        _sigterm_stops_everything(proc, port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ui_leaves_no_process_and_no_port_behind_after_a_signal(tmp_path, signum):
    port = free_port()
    proc = _start_ui(tmp_path / "ws", port)
    try:
        _read_until(proc, r"MLflow UI: ")
        _signal_stops_everything(proc, port, signum)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ui_tags_experiments_of_older_stores_as_training(tmp_path):
    workspace = tmp_path / "ws"
    client = Stores(workspace).client()
    old = client.create_experiment("made-before-the-tag")
    chosen = client.create_experiment("kind-chosen-by-a-user", tags={names.EXPERIMENT_KIND: "finetuning"})
    port = free_port()
    proc = _start("ui", workspace, port)
    try:
        _read_until(proc, r"MLflow UI: ")
        assert client.get_experiment(old).tags[names.EXPERIMENT_KIND] == "custom_model_development"
        assert client.get_experiment(chosen).tags[names.EXPERIMENT_KIND] == "finetuning"
    finally:
        _stop(proc)


def test_server_sigterm_stops_the_mlflow_server_and_its_workers(tmp_path):
    port = free_port()
    proc = _start("server", tmp_path / "ws", port, "--workers", "2")
    try:
        _read_until(proc, r"MLflow server on ")
        assert "OK" in _get(f"http://127.0.0.1:{port}/health")
        _sigterm_stops_everything(proc, port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize(
    ("verb", "ready"), [("ui", r"MLflow UI: (http://\S+)"), ("server", r"on (http://\S+)")]
)
def test_the_mlflow_child_of_a_workspace_named_with_url_characters_writes_nothing_beside_it(
    tmp_path, verb, ready
):
    workspace = tmp_path / "ws?q=1 a%20b"
    experiment = Stores(workspace).client().create_experiment("made-here")
    port = free_port()
    proc = _start(verb, workspace, port)
    try:
        match, _ = _read_until(proc, ready)
        base = match.group(1).split("/#", 1)[0]
        answer = json.loads(_get(f"{base}/api/2.0/mlflow/experiments/get?experiment_id={experiment}"))
        assert answer["experiment"]["name"] == "made-here"  # the child reads the workspace's own store
    finally:
        _stop(proc)
    assert [p.name for p in tmp_path.iterdir()] == [workspace.name]
