"""Lightning's start-up hints that say nothing to an ablate run stay off the terminal."""

import os
import warnings

from lightning.fabric.plugins.environments import SLURMEnvironment

from ablate.train.trainer import quiet_lightning


def test_the_srun_hint_is_not_printed_where_slurm_is_installed(tmp_path, monkeypatch):
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)

    with warnings.catch_warnings(record=True) as before:
        warnings.simplefilter("always")
        SLURMEnvironment._validate_srun_used()
    assert any("srun" in str(w.message) for w in before)  # Lightning does warn here

    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        quiet_lightning()
        SLURMEnvironment._validate_srun_used()
    assert not [w for w in after if "srun" in str(w.message)]
