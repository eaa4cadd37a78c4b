"""Helpers of the engine tests: the in-process CLI and its one-line-error contract, and Table 6's rows.
(A module of its own, not conftest.py: several test folders have a conftest.py, and importing one by name
would clash.)"""

from __future__ import annotations

from ablate.cli import main

# The variants of recipes/table6.yaml, in its order (the paper's Table 6 rows), written out here once.
TABLE6_VARIANTS = [
    "transformer",
    "transformer_d256",
    "transformer_gn",
    "diff",
    "diff_no_gn",
    "diff_lambda_08",
    "diff_lambda_05",
]


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
