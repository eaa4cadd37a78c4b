"""Shared by the engine tests: the in-process CLI and its one-line-error contract, and one thread."""

from __future__ import annotations

import pytest
import torch

from ablate.cli import main


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors gain nothing from intra-op threads; on a loaded 2-core machine OpenMP's spinning
    made forwards ~30x slower. Restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
