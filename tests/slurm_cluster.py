"""A real, single-node SLURM cluster on this machine, for tests (a helper module, not tests).

``local_slurm(tmp_dir)`` starts its own ``munged``, ``slurmctld`` and ``slurmd`` (each in the
foreground, as a child of this process, so we hold their process ids), waits until the node is
idle and yields a :class:`SlurmInfo`. On exit it cancels every job, stops the daemons by pid
(SIGTERM, then SIGKILL) and sweeps any job process or ``slurmstepd`` that outlived them, so
nothing is left behind, even when the body raises.

Everything stays on this machine: the controller and the node are addressed as 127.0.0.1 on
ports picked free at start (slurmd binds 127.0.0.1 only, ``CommunicationParameters=NoInAddrAny``;
slurmctld 22.05 still listens on all interfaces, but every message must carry a credential from
our own munge key), and munge uses its own key and socket. Nothing under ``/etc`` is touched,
and no system service is started or stopped.

Needs root and Debian's ``slurm-wlm`` and ``munge`` packages (``.ci/install-slurm.sh``);
``slurm_available()`` says whether both hold, and ``slurm_unavailable_reason()`` why not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PARTITION = "debug"
CLUSTER_NAME = "dxodetest"
_BINARIES = ("munged", "munge", "slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "scancel")
_DAEMON_NAMES = frozenset({"slurmctld", "slurmd", "slurmstepd", "slurmscriptd", "munged"})


def slurm_unavailable_reason() -> str | None:
    """Why a local SLURM cluster cannot be started here, or None when it can."""
    missing = [b for b in _BINARIES if shutil.which(b) is None]
    if missing:
        return (
            f"SLURM/munge not installed (missing {', '.join(missing)}); "
            "run .ci/install-slurm.sh as root"
        )
    if os.geteuid() != 0:
        return "a local SLURM cluster needs root (SlurmUser=root)"
    return None


def slurm_available() -> bool:
    """True when the SLURM and munge binaries are installed and we are root."""
    return slurm_unavailable_reason() is None


@dataclass(frozen=True)
class SlurmInfo:
    """What a test needs to use the running cluster."""

    conf: Path  # slurm.conf; SLURM_CONF points here while the cluster runs
    partition: str  # the only partition, Default=YES
    node: str  # the node's name (``hostname -s``)
    cpus: int  # CPUs the node offers
    cores: int  # cores (CR_Core allocates whole cores: the most 1-core jobs running at once)
    memory_mb: int  # RealMemory of the node
    root: Path  # the directory holding conf, state, spool and logs
    env: dict[str, str] = field(default_factory=dict)  # SLURM_CONF=..., for child processes

    def run(self, *args: str, check: bool = True, timeout: float = 30.0):
        """Run a SLURM client command (``sinfo``, ``sbatch``...) against this cluster."""
        return subprocess.run(
            list(args),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def logs(self, lines: int = 30) -> str:
        """The last lines of every daemon log, for error messages."""
        return _log_tails(self.root, lines)


class SlurmStartError(RuntimeError):
    """The local cluster did not come up; the message holds the daemons' log tails."""


# --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_hardware() -> dict[str, int]:
    """The node's topology as slurmd itself sees it (``slurmd -C``), else from the OS."""
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    try:
        out = subprocess.run(
            ["slurmd", "-C"], capture_output=True, text=True, timeout=30, env=env
        ).stdout
        fields = dict(item.split("=", 1) for item in out.splitlines()[0].split() if "=" in item)
        hw = {k: int(fields[k]) for k in keys}
    except (OSError, IndexError, KeyError, ValueError, subprocess.SubprocessError):
        cpus = os.cpu_count() or 1
        with open("/proc/meminfo") as f:
            mem_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        hw = {
            "CPUs": cpus,
            "Boards": 1,
            "SocketsPerBoard": 1,
            "CoresPerSocket": cpus,
            "ThreadsPerCore": 1,
            "RealMemory": mem_kb // 1024,
        }
    return hw


def _world_traversable(path: Path) -> bool:
    """munged insists that every directory above its socket is executable by all."""
    for p in [path, *path.parents]:
        try:
            if not os.stat(p).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _socket_dir() -> Path:
    """A short, fresh directory for munge's socket whose ancestors all have o+x."""
    for base in (tempfile.gettempdir(), "/tmp", "/run", "/var/tmp"):
        b = Path(base)
        if b.is_dir() and os.access(b, os.W_OK) and _world_traversable(b):
            d = Path(tempfile.mkdtemp(prefix="dxode-munge-", dir=b))
            d.chmod(0o755)
            return d
    raise SlurmStartError("no directory with o+x ancestors for munge's socket")


def _slurm_conf(root: Path, munge_socket: Path, node: str, hw: dict[str, int]) -> str:
    ctld_port, slurmd_port = _free_port(), _free_port()
    while slurmd_port == ctld_port:
        slurmd_port = _free_port()
    return f"""\
# Written by tests/slurm_cluster.py: a private single-node cluster on 127.0.0.1.
ClusterName={CLUSTER_NAME}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
CommunicationParameters=NoInAddrAny
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root / "slurmd.log"}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobContainerType=job_container/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
KillWait=5
InactiveLimit=0
MinJobAge=60
NodeName={node} NodeAddr=127.0.0.1 NodeHostname={node} CPUs={hw["CPUs"]} \
Boards={hw["Boards"]} SocketsPerBoard={hw["SocketsPerBoard"]} \
CoresPerSocket={hw["CoresPerSocket"]} ThreadsPerCore={hw["ThreadsPerCore"]} \
RealMemory={hw["RealMemory"]} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(missing)"
    return "\n".join(text[-lines:]) or "(empty)"


def _log_tails(root: Path, lines: int = 30) -> str:
    names = ("munged.out", "slurmctld.out", "slurmctld.log", "slurmd.out", "slurmd.log")
    return "\n".join(
        f"--- {root / n} (last {lines} lines)\n{_tail(root / n, lines)}" for n in names
    )


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us, and we stop them
            close_fds=True,
        )


def _stop(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM one of our daemons by its pid, wait, SIGKILL if it lingers, and reap it."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)


def _proc_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _leftovers(conf: Path) -> list[int]:
    """Pids of daemons, step daemons and job processes that belong to *this* cluster.

    Each of them inherited ``SLURM_CONF=<our conf>`` from us (the daemons) or from sbatch's
    exported environment (jobs, which also carry SLURM_JOB_ID); anything else is left alone.
    """
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        env = _proc_env(pid)
        if env.get("SLURM_CONF") != str(conf):
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm in _DAEMON_NAMES or "SLURM_JOB_ID" in env:
            found.append(pid)
    return found


def _sweep(conf: Path, grace: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL, whatever of this cluster outlived its daemons; return the pids."""
    pids = _leftovers(conf)
    if not pids:
        return []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _leftovers(conf):
        time.sleep(0.1)
    for pid in _leftovers(conf):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _cancel_all_jobs(env: dict[str, str], timeout: float = 15.0) -> None:
    """Cancel every job (all are root's here: ``scancel -u root``) and wait for the queue
    to drain, so the step daemons exit before slurmd does."""

    def q(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=15)

    try:
        q("scancel", "-u", "root")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = q("squeue", "-h", "-o", "%i")
            if r.returncode != 0 or not r.stdout.strip():
                return
            time.sleep(0.2)
    except (OSError, subprocess.SubprocessError):
        return


def _wait_idle(
    env: dict[str, str], procs: dict[str, subprocess.Popen], root: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        for name, p in procs.items():
            if p.poll() is not None:
                raise SlurmStartError(
                    f"{name} exited with status {p.returncode} during start-up\n" + _log_tails(root)
                )
        r = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=15
        )
        last = (r.stdout + r.stderr).strip()
        states = r.stdout.split()
        if r.returncode == 0 and states and all(s == "idle" for s in states):
            return
        if time.monotonic() > deadline:
            raise SlurmStartError(
                f"SLURM node not idle after {timeout:.0f} s (sinfo: {last!r})\n" + _log_tails(root)
            )
        time.sleep(0.2)


# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def local_slurm(tmp_dir: str | os.PathLike, start_timeout: float = 60.0) -> Iterator[SlurmInfo]:
    """Start a private single-node SLURM cluster, yield its :class:`SlurmInfo`, tear it down.

    ``tmp_dir`` receives slurm.conf, the munge key, state, spool and every daemon log. While
    the block runs, ``os.environ["SLURM_CONF"]`` points at that slurm.conf (restored after),
    so ``sbatch``/``squeue`` and libraries such as dask-jobqueue use this cluster.
    """
    reason = slurm_unavailable_reason()
    if reason is not None:
        raise SlurmStartError(reason)

    root = Path(tmp_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (root / sub).mkdir(exist_ok=True)
    sock_dir = _socket_dir()
    munge_socket = sock_dir / "munge.socket"
    conf = root / "slurm.conf"
    node = socket.gethostname().split(".")[0]

    saved_conf = os.environ.get("SLURM_CONF")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: dict[str, subprocess.Popen] = {}
    try:
        # munge: a fresh key only this cluster uses (600, owned by us: root).
        key = root / "munge.key"
        key.unlink(missing_ok=True)
        os.close(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        subprocess.run(
            ["dd", "if=/dev/urandom", f"of={key}", "bs=1024", "count=1", "status=none"],
            check=True,
        )
        key.chmod(0o600)
        procs["munged"] = _start(
            [
                "munged",
                "--foreground",
                f"--socket={munge_socket}",
                f"--key-file={key}",
                f"--pid-file={root / 'munged.pid'}",
                f"--seed-file={root / 'munged.seed'}",
                f"--log-file={root / 'munged.log'}",
            ],
            root / "munged.out",
            env,
        )
        deadline = time.monotonic() + 15
        while not munge_socket.exists():
            if procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise SlurmStartError("munged did not create its socket\n" + _log_tails(root))
            time.sleep(0.05)

        hw = _node_hardware()
        conf.write_text(_slurm_conf(root, munge_socket, node, hw))
        procs["slurmctld"] = _start(["slurmctld", "-D", "-i"], root / "slurmctld.out", env)
        procs["slurmd"] = _start(["slurmd", "-D", "-N", node], root / "slurmd.out", env)
        os.environ["SLURM_CONF"] = str(conf)

        _wait_idle(env, procs, root, start_timeout)
        cores = hw["Boards"] * hw["SocketsPerBoard"] * hw["CoresPerSocket"]
        yield SlurmInfo(
            conf=conf,
            partition=PARTITION,
            node=node,
            cpus=hw["CPUs"],
            cores=cores,
            memory_mb=hw["RealMemory"],
            root=root,
            env={"SLURM_CONF": str(conf)},
        )
    finally:
        try:
            if procs.get("slurmctld") is not None and procs["slurmctld"].poll() is None:
                _cancel_all_jobs(env)
            for name in ("slurmd", "slurmctld"):
                _stop(procs.get(name))
            _sweep(conf)  # job processes or step daemons that outlived slurmd
            _stop(procs.get("munged"))
        finally:
            if saved_conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = saved_conf
            shutil.rmtree(sock_dir, ignore_errors=True)
