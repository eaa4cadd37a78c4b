"""Helpers of the engine tests: the in-process CLI and its one-line-error contract. (A module of its
own, not conftest.py: several test folders have a conftest.py, and importing one by name would clash.)"""

from __future__ import annotations

from ablate.cli import main


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """`ablate ARGV` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    """A user error: exit 2, one line on stderr, no traceback, naming what it should."""
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("ablate: error: "), err
    for fragment in fragments:
        assert fragment in err, err
