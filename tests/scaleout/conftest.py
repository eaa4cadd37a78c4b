"""A real PostgreSQL server and a real MLflow tracking server for the scale-out tests.

PostgreSQL: `initdb` and `pg_ctl` (on PATH, or in /usr/lib/postgresql/*/bin) make a cluster in a fresh
temporary folder, listening on 127.0.0.1 on a free port with its unix socket inside that folder, trust
authentication for the `postgres` role (loopback only, thrown away at the end). initdb and the server
refuse to run as root, so when the tests run as root the folder is chowned to `nobody` and every
PostgreSQL binary runs as that user through `setpriv` (util-linux): no login shell or home is needed.
The server is stopped at the end of the session whatever happened (`pg_ctl stop -m immediate`).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # scaleout_helpers, whatever the rootdir/import mode

from scaleout_helpers import cli_command, cli_env  # noqa: E402

from ablate.train.launch import free_port  # noqa: E402

UNPRIVILEGED_USER = "nobody"


def _pg_binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if not found:
        pytest.fail(
            f"PostgreSQL server binary {name!r} not found (on PATH or in /usr/lib/postgresql/*/bin): "
            "install PostgreSQL (apt-get install postgresql); .ci/run does",
            pytrace=False,
        )
    return found


@dataclass
class Postgres:
    port: int
    folder: Path

    def url(self, database: str) -> str:
        # Plain postgresql://: ablate picks the installed driver (psycopg 3) itself.
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _as_postgres_user(folder: Path) -> tuple[list[str], dict[str, str]]:
    """Command prefix and environment to run PostgreSQL binaries as a non-root user."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(folder), "LC_ALL": "C", "LANG": "C"}
    if os.geteuid() != 0:
        return [], env
    user = pwd.getpwnam(UNPRIVILEGED_USER)
    os.chown(folder, user.pw_uid, user.pw_gid)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail(
            "running as root: PostgreSQL must run as an unprivileged user and `setpriv` (util-linux) "
            "is missing",
            pytrace=False,
        )
    return [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"], env


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    initdb, pg_ctl = _pg_binary("initdb"), _pg_binary("pg_ctl")
    # Not under pytest's basetemp: its parents are 0700 root, which `nobody` cannot traverse.
    folder = Path(tempfile.mkdtemp(prefix="ablate-pg-"))
    prefix, env = _as_postgres_user(folder)
    data, sock, log = folder / "data", folder / "sock", folder / "server.log"

    def pg(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*prefix, *args], env=env, cwd=folder, capture_output=True, text=True, timeout=timeout
        )

    started = False
    try:
        done = pg(initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C")
        assert done.returncode == 0, f"initdb failed:\n{done.stdout}\n{done.stderr}"
        pg("mkdir", "-m", "700", str(sock))
        for _ in range(5):  # a free port can be taken between the probe and the bind: try another
            port = free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={sock} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            done = pg(pg_ctl, "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o", options, "start")
            if done.returncode == 0:
                started = True
                break
        assert started, (
            f"pg_ctl start failed:\n{done.stdout}\n{done.stderr}\n{log.read_text() if log.exists() else ''}"
        )
        yield Postgres(port=port, folder=folder)
    finally:
        if started:
            pg(pg_ctl, "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop")
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class MlflowServer:
    url: str
    artifacts: Path


@pytest.fixture(scope="session")
def mlflow_server(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """`ablate server` over a PostgreSQL backend store, artifacts served from a temporary folder."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    store = postgres.create_database("mlflow")
    port = free_port()
    log = open(folder / "server.log", "w")  # noqa: SIM115 (closed below)
    # Output to a file, not a pipe: the server logs every request, and a full pipe would block it.
    proc = subprocess.Popen(
        cli_command(
            "server",
            "--backend-store-uri",
            store,
            "--artifacts",
            str(folder / "artifacts"),
            "--port",
            str(port),
            "--workspace",
            str(folder / "ws"),
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env=cli_env(),
        start_new_session=True,
    )
    try:
        url = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and url is None and proc.poll() is None:
            for line in (folder / "server.log").read_text().splitlines():
                if line.startswith("MLflow server on "):
                    url = line.split()[3]
            time.sleep(0.5)
        assert url == f"http://127.0.0.1:{port}", (
            f"ablate server did not start:\n{(folder / 'server.log').read_text()}"
        )
        yield MlflowServer(url=url, artifacts=folder / "artifacts")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # `ablate server` stops its mlflow server, then exits
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


# --- a one-node Slurm cluster on loopback -------------------------------------------------------------------
SLURM_BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue")
SLURM_CONF = """ClusterName=ablatetest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.socket,cred_expire=20
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=5
SchedulerParameters=sched_interval=1
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


# cred_expire: how long a job's credentials live, and so how long Slurm holds a requeued job before starting
# it again (120 s by default). Starting it sooner (`scontrol update StartTime=now`) has slurmd refuse it,
# "Job credential revoked", and the task ends FAILED; 20 s is short for a test and long for a step's launch.


@dataclass
class Slurm:
    folder: Path
    conf: Path


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    """munged, slurmctld and slurmd (Debian's munge and slurm-wlm) for one node on 127.0.0.1 with 2 CPUs,
        no cgroups, every state file in a temporary folder; SLURM_CONF points this process (and the jobs it
        submits) at it. The daemons run as this user: root, as CI runs (slurmd needs it to start jobs as
    their users)."""
    missing = [name for name in SLURM_BINARIES if shutil.which(name) is None]
    if missing:
        pytest.skip(f"Slurm binaries missing ({', '.join(missing)}): apt-get install slurm-wlm munge")
    folder = Path(tempfile.mkdtemp(prefix="ablate-slurm-"))
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    key = folder / "munge.key"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    key.chmod(0o600)
    daemons: list[subprocess.Popen] = []
    saved = os.environ.get("SLURM_CONF")
    try:
        daemons.append(
            subprocess.Popen(
                ["munged", "--foreground", "--force", f"--socket={folder}/munge.socket", f"--key-file={key}"]
                + [f"--pid-file={folder}/munged.pid", f"--seed-file={folder}/munged.seed"],
                stdout=open(folder / "munged.out", "w"),  # noqa: SIM115 (closed with the process)
                stderr=subprocess.STDOUT,
            )
        )
        conf = folder / "slurm.conf"
        conf.write_text(
            SLURM_CONF.format(
                host=socket.gethostname(), folder=folder, ctld_port=free_port(), d_port=free_port()
            )
        )
        os.environ["SLURM_CONF"] = str(conf)
        for daemon in ("slurmctld", "slurmd"):
            daemons.append(
                subprocess.Popen(
                    [daemon, "-D", "-f", str(conf)],
                    stdout=open(folder / f"{daemon}.out", "w"),  # noqa: SIM115 (closed with the process)
                    stderr=subprocess.STDOUT,
                )
            )
        while True:  # the node registers with the controller: an event, the test's timeout the hang guard
            assert all(d.poll() is None for d in daemons), _slurm_logs(folder)
            state = subprocess.run(["sinfo", "--noheader", "--format=%t"], capture_output=True, text=True)
            if state.returncode == 0 and state.stdout.strip() == "idle":
                break
            time.sleep(0.5)
        yield Slurm(folder=folder, conf=conf)
    finally:
        for daemon in reversed(daemons):
            _stop(daemon)
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        shutil.rmtree(folder, ignore_errors=True)


def _slurm_logs(folder: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(folder.glob("*.out")))
