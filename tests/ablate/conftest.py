"""Engine tests run on one thread (helpers: cli_helpers.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors gain nothing from intra-op threads; on a loaded 2-core machine OpenMP's spinning
    made forwards ~30x slower. Restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
