"""The README and docs/*.md keep their commands honest, and every docs page can be found from the README.

A command a page shows (a line of a ```bash block, or a `$ ` line of a transcript block; continuation
lines joined, `&&` splitting one line into several, comments and bare variable assignments left out) is
either listed in RUN_BY below with what runs it, or sits in a block marked `# illustration` (a comment
that says the tests do not run it, and why). A listed command's runner is `.ci/run` or a test
(`file::function`, which must exist), and its source holds the command's verb (`"sweep"`) or program
(`pip`), every option it passes (`--scale`) and every environment variable it sets (`NODE_RANK`), unless
the entry names an option the runner replaces and why (a small recipe of its own instead of `--scale small`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MINI = "a small recipe of its own, with one scale"

# Each command the pages show that something runs: (command as shown, runner, {replaced token: why}).
RUN_BY: list[tuple[str, str, dict[str, str]]] = [
    (
        "pip install torch==2.13.0 -e .",
        ".ci/run",
        {},  # CI installs the same package with its test extras: `-e '.[dev]'`
    ),
    (
        "ablate sweep recipes/table6.yaml --scale tiny --yes --reports ablate-runs/reports",
        "tests/e2e/test_sweep.py::test_a_tiny_table6_sweep_resolves_its_recipe_once",
        {},  # with two steps per row on the mini corpus (`--base.train.*` overrides)
    ),
    ("pip install torch==2.13.0 -e '.[dev]'", ".ci/run", {}),
    (
        "ablate prepare pypi-sdists",
        "tests/ablate/test_builtin_corpus.py::test_prepare_builds_a_builtin_corpus_by_name",
        {},  # the name's manifest pointed at small archives the test makes: no network in tests
    ),
    ("python -m pytest", ".ci/run", {}),
    (
        "ablate check recipes/table6.yaml",
        "tests/ablate/test_check_cli.py::test_check_table6_prints_seven_matched_variants",
        {},
    ),
    (
        "ablate check recipes/scaling-size.yaml",
        "tests/ablate/test_strategy_choice.py::test_check_plans_the_papers_scale_with_fsdp_where_a_replica_does_not_fit",
        {},
    ),
    (
        "ablate server --backend-store-uri $MLFLOW_DB --artifacts /data/mlflow-artifacts --host 0.0.0.0 "
        "--port 5000 --allowed-hosts track.cluster:5000",
        "tests/scaleout/conftest.py::mlflow_server",
        {
            "--host": "the tests' server listens on loopback, the default",
            "--allowed-hosts": "loopback needs none",
        },
    ),
    (
        "ablate sweep recipes/table6.yaml --scale small --storage $STUDY --tracking-uri $MLFLOW --no-train --yes",
        "tests/scaleout/test_postgres_workers.py::test_three_workers_on_postgres_run_each_trial_once_and_log_to_the_server",
        {"--scale": MINI},
    ),
    (
        "ablate worker recipes/table6.yaml --scale small --storage $STUDY --tracking-uri $MLFLOW "
        "--workspace /local/ablate-runs",
        "tests/scaleout/test_postgres_workers.py::test_three_workers_on_postgres_run_each_trial_once_and_log_to_the_server",
        {"--scale": MINI},
    ),
    (
        "ablate report recipes/table6.yaml --scale small --storage $STUDY --tracking-uri $MLFLOW",
        "tests/scaleout/test_postgres_workers.py::test_three_workers_on_postgres_run_each_trial_once_and_log_to_the_server",
        {"--scale": MINI},
    ),
    *[
        (
            f"MASTER_ADDR=10.0.0.11 MASTER_PORT=29500 NODE_RANK={rank} ablate train recipes/x.yaml --variant diff "
            "--scale paper --tracking-uri $MLFLOW --workspace /shared/ablate-runs",
            "tests/scaleout/test_ddp.py::test_two_nodes_on_loopback_match_one_process",
            {"--scale": MINI, "--tracking-uri": "the workspace's own store"},
        )
        for rank in (0, 1)
    ],
    (
        "ablate status mini.yaml",
        "tests/e2e/test_status_tokens.py::test_status_counts_the_plans_tokens_and_a_running_trials_progress",
        {},
    ),
]
BLOCK = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)
ASSIGNMENT = re.compile(r"^(export +)?[A-Za-z_][A-Za-z0-9_]*=\S*$")


def commands(block: str, transcript: bool) -> list[str]:
    """The commands of one block, each as one normalised line."""
    lines = [line.strip() for line in block.replace("\\\n", " ").splitlines()]
    if transcript:
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    out = []
    for line in lines:
        line = line.split(" #", 1)[0] if not line.startswith("#") else ""
        for command in line.split("&&"):
            command = " ".join(command.replace('"', "").split())
            if command and not ASSIGNMENT.match(command):
                out.append(command)
    return out


def shown() -> list[tuple[str, str, bool]]:
    """(page, command, marked as an illustration) for every command the pages show."""
    found = []
    for page in PAGES:
        for match in BLOCK.finditer(page.read_text()):
            lang, body = match.group(2), match.group(3)
            if lang != "bash" and not (lang == "" and re.search(r"^\s*\$ ", body, re.M)):
                continue
            illustration = re.search(r"#\s*illustration\b", body) is not None
            for command in commands(body, transcript=lang != "bash"):
                found.append((page.name, command, illustration))
    return found


def test_every_command_shown_is_run_or_marked_an_illustration():
    listed = {command for command, _, _ in RUN_BY}
    unaccounted = [
        f"{page}: {cmd}" for page, cmd, illustration in shown() if not illustration and cmd not in listed
    ]
    assert not unaccounted, (
        f"run in a test and list in RUN_BY, or mark the block # illustration: {unaccounted}"
    )
    stale = listed - {cmd for _, cmd, illustration in shown() if not illustration}
    assert not stale, f"RUN_BY lists commands no page shows: {stale}"


def runner_source(runner: str) -> str:
    path, _, name = runner.partition("::")
    source = (ROOT / path).read_text()
    if name:
        defined = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
        assert name in defined, f"{runner}: no such function"
    return source


def missing(command: str, source: str, replaced: dict[str, str]) -> list[str]:
    """The verb (or program), variables and options of `command` that `source` does not pass."""
    words = command.split()
    env = [w.split("=", 1)[0] for w in words if ASSIGNMENT.match(w)]
    words = words[len(env) :]
    program = f'"{words[1]}"' if words[0] == "ablate" else words[0]
    options = [w.split("=", 1)[0] for w in words if w.startswith("-") and w != "-"]
    assert set(replaced) <= set(options), (
        f"replaced names no option of the command: {set(replaced) - set(options)}"
    )
    return [t for t in [program, *env, *options] if t not in source and t not in replaced]


@pytest.mark.parametrize("command, runner, replaced", RUN_BY, ids=[c[:60] for c, _, _ in RUN_BY])
def test_the_runner_passes_what_the_command_passes(command, runner, replaced):
    absent = missing(command, runner_source(runner), replaced)
    assert not absent, f"{runner} does not pass {absent} of `{command}`"


def test_the_checks_catch_a_missing_verb_option_or_variable_and_read_blocks_as_shown():
    source = 'main(["sweep", str(recipe), "--scale", "tiny"])'
    assert missing("ablate sweep r.yaml --scale tiny --no-train", source, {}) == ["--no-train"]
    assert missing("ablate worker r.yaml --scale tiny", source, {}) == ['"worker"']
    assert missing("N=1 ablate sweep r.yaml --seeds 0 1", source, {"--seeds": "why"}) == ["N"]
    block = (
        'X=1\nablate check r.yaml \\\n    --scale "$S"  # a comment\n# a line\npip install . && ablate ui\n'
    )
    assert commands(block, transcript=False) == [
        "ablate check r.yaml --scale $S",
        "pip install .",
        "ablate ui",
    ]
    assert commands("$ ablate status r.yaml\nsweep r: 1/2 trials\n", transcript=True) == [
        "ablate status r.yaml"
    ]


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in PAGES[1:] if f"](docs/{p.name}" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_reach_a_file_and_a_heading():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#([^)\s]+))?\)", page.read_text()):
            path, anchor = (page.parent / target[0]).resolve(), target[1]
            if not path.exists():
                broken.append(f"{page.name} -> {target[0]}")
            elif anchor and anchor not in {slug(h) for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}:
                broken.append(f"{page.name} -> {target[0]}#{anchor}")
    assert not broken, broken


def backend_rows(page: str) -> list[str]:
    """The rows of the table under '### Attention backends' (the header and the rule left out)."""
    section = page.split("### Attention backends", 1)[1].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_the_docs_list_the_attention_backends_of_the_table():
    from components.attention.backends import TABLE

    expected = [
        f"| `{b.name}` | {', '.join(d.upper() for d in b.runs_on)} | {b.about} |" for b in TABLE.values()
    ]
    shown = backend_rows((ROOT / "docs" / "recipes-and-components.md").read_text())
    assert shown == expected, "docs/recipes-and-components.md's backends, from TABLE:\n" + "\n".join(expected)
