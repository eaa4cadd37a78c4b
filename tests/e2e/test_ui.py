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

from mini_project import write_recipe

from ablate.cli import main
from ablate.store import tracking
from ablate.train.launch import free_port


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid`, read from /proc (parent links), whatever its process group."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
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
    children = _descendants(proc.pid)
    assert children, "the MLflow server runs in child processes; none found"
    proc.send_signal(signal.SIGTERM)  # to the ablate process only, as `kill PID` does
    assert proc.wait(timeout=60) == 0
    deadline = time.time() + 10  # orphans reparented to init are reaped asynchronously
    while time.time() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.2)
    survivors = [pid for pid in children if _alive(pid)]
    assert not survivors, f"left running after SIGTERM: {survivors}"
    assert _port_free(port)


def test_ui_opens_on_a_finished_sweeps_runs_and_sigterm_stops_its_workers(tmp_path):
    workspace = tmp_path / "ws"
    recipe = write_recipe(tmp_path)
    assert (
        main(
            ["sweep", str(recipe), "--yes", "--workspace", str(workspace), "--reports", str(tmp_path / "rep")]
        )
        == 0
    )
    client = tracking.client_for(workspace, None)
    experiment = client.get_experiment_by_name("mini")
    finished = {
        r.info.run_id
        for r in client.search_runs([experiment.experiment_id])
        if r.data.tags.get("ablate.role") != "sweep" and r.info.status == "FINISHED"
    }
    assert len(finished) == 2
    # MLflow 3 opens an experiment as a training experiment only with this tag
    assert experiment.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.cli", "ui", "--workspace", str(workspace), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        first_line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in first_line
        match, _ = _read_until(proc, r"runs of mini: (\S+)")
        url = match.group(1)
        assert url == f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}/runs"
        base, route = url.split("/#", 1)
        assert "<html" in _get(base + "/").lower()  # the single-page app that routes `route`
        # The page's own request: the runs of the experiment the URL names, all of the sweep's finished runs.
        experiment_id = route.split("/")[2]
        answer = json.loads(
            _get(
                f"{base}/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id], "max_results": 100}
            )
        )
        served = {r["info"]["run_id"] for r in answer["runs"] if r["info"]["status"] == "FINISHED"}
        assert finished <= served
        _sigterm_stops_everything(proc, port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ui_tags_experiments_of_older_stores_as_training(tmp_path):
    workspace = tmp_path / "ws"
    client = tracking.client_for(workspace, None)
    old = client.create_experiment("made-before-the-tag")
    chosen = client.create_experiment(
        "kind-chosen-by-a-user", tags={tracking.EXPERIMENT_KIND_TAG: "finetuning"}
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.cli", "ui", "--workspace", str(workspace), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        _read_until(proc, r"runs of made-before-the-tag: ")
        assert client.get_experiment(old).tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
        assert client.get_experiment(chosen).tags[tracking.EXPERIMENT_KIND_TAG] == "finetuning"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_server_sigterm_stops_the_mlflow_server_and_its_workers(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ablate.cli",
            "server",
            "--workspace",
            str(tmp_path / "ws"),
            "--port",
            str(port),
            "--workers",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        _read_until(proc, r"MLflow server on ")
        assert "OK" in _get(f"http://127.0.0.1:{port}/health")
        _sigterm_stops_everything(proc, port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
