"""The device check (benchmarks/device/check.py): its dry run end to end on CPU (part m, the memory plan
beside FSDP2 on one rank, included), as the GPU machine runs it (scipy, matplotlib, zstandard, pandas and
threadpoolctl hidden: the image lacks them), and a part that fails or overruns its time box losing nothing
the others wrote. Parts e and x (`torch.compile`) are left
out of the dry run: inductor takes minutes on a 2-core CPU (tests/components/test_compile.py checks the
compiled model, tests/ablate/test_compile_time.py its compile time apart)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "benchmarks" / "device" / "check.py"


# Started by every Python of the run (a sitecustomize on PYTHONPATH): sys.path's finder, blind to the
# packages the GPU image lacks, modules and distributions alike, so they are absent, not broken.
HIDING = """
import sys
from importlib.machinery import PathFinder

BLOCKED = {"scipy", "matplotlib", "zstandard", "pandas", "threadpoolctl"}


class Hiding:
    def find_spec(self, name, path=None, target=None):
        return None if name.split(".")[0] in BLOCKED else PathFinder.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):
        for dist in PathFinder.find_distributions(*args, **kwargs):
            if (dist.metadata["Name"] or "").lower() not in BLOCKED:
                yield dist

    def invalidate_caches(self):
        PathFinder.invalidate_caches()


sys.meta_path[:] = [Hiding() if f is PathFinder else f for f in sys.meta_path]
"""


def load_check():
    spec = importlib.util.spec_from_file_location("device_check", CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_a_part_that_fails_or_overruns_is_recorded_and_stopped(tmp_path):
    check = load_check()
    (tmp_path / "logs").mkdir()
    slow = check.run_part("x", [sys.executable, "-c", "import time; time.sleep(600)"], 1.0, tmp_path)
    failed = check.run_part("y", [sys.executable, "-c", "raise SystemExit(3)"], 60.0, tmp_path)
    assert slow["status"] == "stopped at its time box (1 s)" and slow["seconds"] < 60
    assert failed["status"] == "failed (exit 3)"


def test_every_part_keeps_the_kernels_launch_choices_where_ablate_train_does(tmp_path):
    """The check's parent names the folder without importing ablate (it runs before the install): the same
    folder as the workspace's own (`Workspace.kernel_configs`), so part c's runs and the other parts share it."""
    from ablate.core.workspace import Workspace

    assert load_check().kernel_cache(tmp_path.resolve()) == Workspace(tmp_path).kernel_configs


def test_the_plan_never_exceeds_the_budget(monkeypatch):
    check = load_check()
    everything = list(check.PARTS)
    for parts in (everything, check.DEFAULT, ["d"], ["a", "b"], ["c", "e", "d"], everything[::-1]):
        for budget in (0.0, 20.0, 100.0, 270.0, 450.0, 900.0):
            for spent in (0.0, 30.0, 200.0, 460.0):
                boxes = check.plan(budget, spent, parts)
                assert list(boxes) == parts and min(boxes.values()) >= 0
                assert sum(boxes.values()) <= max(0.0, budget - spent) + 1e-9
    boxes = check.plan(500.0, 30.0, check.DEFAULT)  # the shares fit: each as given, x the rest
    assert [boxes[p] for p in "abctwp"] == [check.PARTS[p].share_s for p in "abctwp"]
    assert sum(boxes.values()) == 470.0
    # a new part is one entry, before x: its share comes out of x's box
    part = check.Part("another kernel's bench", "kernels:other", 40, False, "one sweep")
    monkeypatch.setattr(check, "PARTS", {**check.PARTS, "y": part})
    more = check.plan(500.0, 30.0, [*check.DEFAULT[:-1], "y", "x"])
    assert more["y"] == 40 and more["x"] == boxes["x"] - 40


def sibling(name: str):
    sys.path.insert(0, str(CHECK.parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(CHECK.parent))


def plan_run(*args: str, wheels: Path | None) -> subprocess.CompletedProcess:
    extra = ["--wheels", str(wheels)] if wheels else ["--wheels", "/nonexistent-wheels"]
    command = [sys.executable, str(CHECK), "--plan", *extra, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture
def wheels(tmp_path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / "optuna-4.5.0-py3-none-any.whl").write_bytes(b"")
    return folder


def test_part_d_is_sized_to_land_in_its_box(wheels):
    runs = sibling("runs")
    for box in (110.0, 135.0, 405.0, 3000.0):
        sizing = runs.d_sizing(box, 3)
        assert sizing.fits and sizing.expected_s * runs.D_SAFETY <= box
        assert (
            sizing.budgets == sorted(sizing.budgets)
            and sizing.steps * sizing.batch_tokens == sizing.budgets[-1]
        )
    assert runs.d_sizing(405.0, 3).multiplier >= 1 > runs.d_sizing(135.0, 3).multiplier
    assert not runs.d_sizing(10.0, 3).fits
    plan = plan_run("--parts", "d", wheels=wheels)  # d alone, when named, with the whole budget
    assert plan.returncode == 0 and "| d |" in plan.stdout and "over the box" not in plan.stdout, plan.stdout


def test_the_default_plan_fits_500_s_at_the_h200s_part_times(wheels):
    """Every default part's seconds on the H200 (measured, or derived from the measured) within its box in
    the 500 s plan; the parts that replaced the token budgets in it; a budget too short says which part
    would overrun, and exits 1."""
    check = load_check()
    assert check.DEFAULT == ["a", "b", "c", "t", "w", "p", "m", "x"]  # d and e only when named
    boxes = check.plan(500.0, check.INSTALL_GUESS_S, check.DEFAULT)
    for part in check.DEFAULT:
        assert check.PARTS[part].expected_s <= boxes[part], (part, boxes)
    plan = plan_run(wheels=wheels)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "| total | | 500 |" in plan.stdout and "over their box" not in plan.stdout
    assert "| d |" not in plan.stdout and all(f"| {p} |" in plan.stdout for p in "wmx")
    short = plan_run("--budget-s", "450", wheels=wheels)
    assert short.returncode == 1 and "over their box at the H200's seconds: x" in short.stdout


def test_a_plan_without_the_wheels_folder_stops_before_any_machine_is_taken(tmp_path):
    """`--plan`, run where the lease is asked for, stops in one line (exit 2) with no wheels to carry."""
    plan = plan_run(wheels=tmp_path / "absent")
    assert plan.returncode == 2
    assert plan.stderr.strip().splitlines() == [
        f"--wheels: {tmp_path / 'absent'} holds no wheels; build it where a package index is reachable with "
        "python benchmarks/device/wheels.py and carry the folder with the working tree"
    ]


def test_each_path_s_rows_give_diff_against_the_transformer_on_it_and_on_its_fastest(tmp_path):
    paths = sibling("paths")
    bench = tmp_path / "bench.csv"
    bench.write_text("variant,seq_len,train_tok_s\ntransformer,2048,300000\ndiff,2048,240000\n")
    rows = paths.path_rows("eager-triton", "triton", False, bench, "ok", 12.0, 400000.0)
    diff = next(r for r in rows if r["variant"] == "diff")
    assert (diff["diff_over_transformer"], diff["diff_over_fastest_transformer"]) == ("0.800", "0.600")
    rows = paths.path_rows("eager-triton", "triton", False, bench, "ok", 12.0, 200000.0)  # this path fastest
    assert next(r for r in rows if r["variant"] == "diff")["diff_over_fastest_transformer"] == "0.800"
    failed = paths.path_rows(
        "x", "sdpa_cudnn", True, tmp_path / "none.csv", "failed (exit 2)", 3.0, None, "why"
    )
    assert failed == [{"path": "x", "backend": "sdpa_cudnn", "compiled": True, "seconds": 3.0,
                       "status": "failed (exit 2)", "note": "why"}]  # fmt: skip


def wait_for(out: Path, part: str, proc: subprocess.Popen, timeout_s: float = 1500) -> None:
    """Until the README's table of parts lists `part` (polled every 0.1 s; written after parts.csv), or the
    check ends."""
    waited = 0.0
    readme = out / "README.md"
    while proc.poll() is None and waited < timeout_s:
        if readme.exists() and f"| {part} | " in readme.read_text():
            return
        time.sleep(0.1)
        waited += 0.1


def cut_everything(proc: subprocess.Popen) -> None:
    """A lease cut: the check and every process under it (each part runs in its own session) killed at
    once, the check stopped first so that it starts nothing meanwhile."""
    os.kill(proc.pid, signal.SIGSTOP)
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # after the name: state, ppid, ...
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [proc.pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


@pytest.mark.slow
def test_dry_run_on_cpu_keeps_each_part_through_a_lease_cut(tmp_path):
    """The dry run of a-d cut (the whole process group killed) as soon as part b is recorded: a and b's
    results and the README stay; a second run of c, t, w, p and d into the same folder completes it."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "sitecustomize.py").write_text(HIDING)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(blocked)}
    command = [sys.executable, str(CHECK), "--out", str(out), "--device", "cpu", "--dry", "--budget-s", "1500",
               "--workspace", str(tmp_path / "ws")]  # fmt: skip
    # e is left out: minutes of compiling on a 2-core CPU
    cut = subprocess.Popen([*command, "--parts", "a", "b", "c", "d"], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wait_for(out, "b", cut)
    assert cut.poll() is None, "the check ended before the cut"
    cut_everything(cut)
    logs = lambda: "".join(p.read_text() for p in (out / "logs").glob("*.log"))  # noqa: E731
    assert [(r["part"], r["status"]) for r in rows(out / "parts.csv")] == [
        ("install", "ok"), ("a", "ok"), ("b", "ok")
    ], logs()  # fmt: skip
    kernels = rows(out / "a_kernels.csv")
    assert len(kernels) == 88 and {r["status"] for r in kernels} == {"pass", "n/a"}
    assert {r["variant"] for r in rows(out / "b_bench" / "bench.csv")} == {"transformer", "diff"}
    readme = (out / "README.md").read_text()
    assert "88 checks" in readme and readme.count("(not run)") == 6  # c, e, w and x, p, m, d
    assert json.loads((out / "versions.json").read_text())["after_install"]

    proc = subprocess.run([*command, "--parts", "c", "t", "w", "p", "m", "d"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(r["part"], r["status"]) for r in rows(out / "parts.csv")] == [
        (part, "ok") for part in ("install", "a", "b", "install", "c", "t", "w", "p", "m", "d")
    ], logs()
    # part w: a path without a kernel on the device is a row saying why, and the next path runs
    paths = rows(out / "w_paths.csv")
    assert [(r["path"], r["variant"], r["status"]) for r in paths] == [
        ("eager-sdpa_cudnn", "", "failed (exit 2)"), ("eager-auto", "transformer", "ok"), ("eager-auto", "diff", "ok")
    ]  # fmt: skip
    assert "sdpa_cudnn has no kernel for cpu" in paths[0]["note"]
    assert float(paths[2]["diff_over_transformer"]) == pytest.approx(
        float(paths[2]["train_tok_s"]) / float(paths[1]["train_tok_s"]), abs=1e-3
    )
    # part p: one profiled step per arm, its top kernels with their shares
    assert [r["variant"] for r in rows(out / "p_steps.csv")] == ["transformer", "diff"]
    kernels = rows(out / "p_profile.csv")
    assert {r["variant"] for r in kernels} == {"transformer", "diff"}
    assert all(0 < float(r["share_of_kernels"]) <= 1 for r in kernels)
    assert any("mm" in r["kernel"] for r in kernels)
    # part m: the memory plan beside FSDP2 on one rank: the model state exact, the step's peak near the plan
    memory = rows(out / "m_memory.csv")
    assert [(r["variant"], r["activation_checkpointing"]) for r in memory] == [
        ("transformer", "False"), ("diff", "False"), ("diff", "True")
    ]  # fmt: skip
    assert all(r["planned_state"] == r["measured_state"] for r in memory), memory
    assert all(0.5 < float(r["peak_over_plan"]) < 1.5 for r in memory), memory
    assert int(memory[2]["planned_activations"]) < int(memory[1]["planned_activations"])
    assert "## (m) the memory plan" in (out / "README.md").read_text()
    # part t: the triton kernel (Triton's interpreter on CPU) against float64, then timed beside split V
    triton = importlib.util.find_spec("triton") is not None  # the `[triton]` extra; .ci/run installs it
    assert {r["status"] for r in rows(out / "t_kernel.csv")} == ({"pass"} if triton else {"n/a"})
    timed = {"transformer_sdpa_flash", "diff_split_v_sdpa_flash"}
    timed |= {"diff_triton", "transformer_triton"} if triton else set()  # else their rows name the reason
    assert {r["arm"] for r in rows(out / "t_bench.csv") if r["ms_fwd_bwd"]} == timed
    untimed = [r["note"] for r in rows(out / "t_bench.csv") if not r["ms_fwd_bwd"]]
    assert all("pip install 'ablate[triton]'" in note for note in untimed), untimed
    kernels = rows(out / "a_kernels.csv")
    assert {r["status"] for r in kernels} == {"pass", "n/a"}
    flash = [r for r in kernels if r["backend"] == "sdpa_flash" and r["kind"] == "diff"]
    assert flash and all(
        r["status"] == "pass" and "flash_attention_for_cpu x2" in r["sdpa_ops"] for r in flash
    )
    assert all(r["status"] == "n/a" for r in kernels if r["backend"] in ("sdpa_efficient", "sdpa_cudnn"))
    curve = [float(r["train/loss"]) for r in rows(out / "c_train.csv") if r["train/loss"]]
    assert curve[-1] < curve[0]
    budgets = rows(out / "d_budgets.csv")
    assert [(r["budget_tokens"], r["status"]) for r in budgets] == [
        ("1024", "FINISHED"),
        ("2048", "FINISHED"),
    ]
    assert {p.name for p in (out / "stores").iterdir()} == {"mlflow.db", "optuna.journal"}
    assert not (tmp_path / "ws" / "runs" / "device-check-train-small").exists()  # c's checkpoints removed
    readme = (out / "README.md").read_text()
    assert readme.startswith("# Device check: ") and "## What each number means" in readme
    assert "(no results)" not in readme and "(no finished budget)" not in readme
    assert readme.count("(not run)") == 1  # part e


def test_the_precheck_stops_in_one_line_without_wheels(tmp_path):
    """An image lacking a needed package and no wheels carried: one line, exit 2, before any part."""
    check = load_check()
    found = [{"dist": "torch", "installed": "2.11.0", "required": ">=2.4,<3", "ok": True},
             {"dist": "optuna", "installed": None, "required": ">=4.0,<6", "ok": False}]  # fmt: skip
    args = SimpleNamespace(wheels=tmp_path)
    line = check.precheck(args, found)
    assert line.startswith(
        f"--wheels: {tmp_path} holds no wheels and the image lacks (or has too old) optuna;"
    )
    (tmp_path / "optuna-4.5.0-py3-none-any.whl").write_bytes(b"")
    assert check.precheck(args, found) is None
    found[0] |= {"installed": "2.3.1", "ok": False}
    assert check.precheck(args, found) == (
        "image: torch 2.3.1 (needs >=2.4,<3); these are the image's own, not carried"
    )
    needed = {r["dist"]: r for r in check.versions()}
    assert needed["lightning"]["required"] == ">=2.6,<3" and needed["lightning"]["ok"] is True


def test_lambdas_gradient_is_measured_against_its_sums_rounding_and_still_catches_a_wrong_sign():
    """Part a's λ gradient is one cancelling sum: bf16 rounding of its terms passes where a relative error
    of the value would not (grouped kv heads, whose dλ is small), and a flipped sign still fails."""
    import torch

    sys.path.insert(0, str(CHECK.parent))
    try:
        import backend_check
    finally:
        sys.path.remove(str(CHECK.parent))
    cpu = torch.device("cpu")
    row = backend_check.check_one("diff", "math", torch.bfloat16, 2, cpu, 256, 64, 4)
    assert row["status"] == "pass", row
    q, k, v, lam = backend_check.inputs("diff", 256, 64, 4, 2, torch.float64, cpu)
    wide = [t.detach() for t in (q, k, v)]
    expected = backend_check.reference("diff", *wide, lam)
    grad_out = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)).double()
    (want,) = torch.autograd.grad(expected, [lam], grad_out)
    assert abs(want.item()) < 0.05 * grad_out.norm().item()  # the cancelling case
    bf16_like = want * (1 + 2**-8)
    assert backend_check.lambda_grad_err(bf16_like, want, wide, grad_out) < 1e-4
    flipped = backend_check.lambda_grad_err(-want, want, wide, grad_out)
    assert flipped > backend_check.TOLERANCE[torch.bfloat16], flipped


def test_the_cost_models_refit_recovers_a_known_line_and_fits_the_h200s_cores():
    """benchmarks/diff_kernel_cost.py --refit: least squares of ms = c0 + FLOPs / (eta x peak) recovers a
    line it was given; on the H200's measured cores every fitted time is within 0.3 ms of the measured."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import diff_kernel_cost as model
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    peak = model.CARDS["H200"]["tflops"] * 1e12
    made = {n: 0.7 + model.cost("transformer", n)["flops"] / (0.45 * peak) * 1e3 for n in model.SEQS}
    c0, eta = model.fit(made, "transformer")
    assert c0 == pytest.approx(0.7, abs=1e-9) and eta == pytest.approx(0.45, rel=1e-9)
    cores = model.measured_cores()
    assert set(cores) == set(model.FITTED_ARMS) and cores["transformer_sdpa_flash"][2048] == 1.074
    for arm, points in cores.items():
        c0, eta = model.fit(points, model.FITTED_ARMS[arm])
        for n, ms in points.items():
            assert abs(c0 + model.cost(model.FITTED_ARMS[arm], n)["flops"] / (eta * peak) * 1e3 - ms) < 0.3
    assert "| 2048 | next kernel (single-pass backward), predicted | | | 1.76 |" in model.refit()
    # FLOPs once per product: the Transformer's core at 8,192 tokens is 2 sequences x 12 heads x the query-key
    # pairs of the causal 64 x 64 tiles x 7 products (S, PV; S, dP, dV, dK, dQ) x 2 x 64 FLOPs
    pairs = 128 * 129 // 2 * 64 * 64
    assert model.cost("transformer", 8192)["flops"] == 2 * 12 * pairs * 7 * 2 * 64
    assert model.cost("triton", 8192)["flops"] == 6 * pairs * 2 * 20 * 2 * 64  # a Diff head: 20 products
