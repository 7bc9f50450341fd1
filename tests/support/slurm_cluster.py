"""A throwaway 3-node Slurm cluster on localhost for the tests marked ``slurm``.

Debian's slurm-wlm (22.05) is built with multiple-slurmd support, so three ``slurmd -N nK`` on one
host register as three nodes. Everything runs in the foreground under our own ``Popen`` (a private
munged on its own socket, slurmctld, three slurmd), lives in one fresh directory, and is stopped by
pid. Nothing depends on systemd or on a system-wide munged.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nereus.cluster.slurm_watch import JobInfo, parse_job_record

NODE_NAMES = ("n1", "n2", "n3")
NODE_CPUS = 2
SLURMD_BASE_PORT = 17001


class SlurmClusterError(RuntimeError):
    """The local cluster did not come up; the message carries the daemons' log tails."""


def missing_requirements() -> str | None:
    """Why the local cluster cannot run here, or None when it can."""
    for exe in ("slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "munged"):
        if shutil.which(exe) is None and not Path("/usr/sbin", exe).exists():
            return f"{exe} is not installed (dev/setup.sh installs it as root)"
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (SlurmUser=root, munged as user munge)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (the munge package creates it)"
    return None


def _exe(name: str) -> str:
    found = shutil.which(name)
    return found if found else str(Path("/usr/sbin", name))


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _slurmd_base_port() -> int:
    """17001–17003 when free (a second cluster on this host moves up by 10)."""
    for base in range(SLURMD_BASE_PORT, SLURMD_BASE_PORT + 200, 10):
        if all(_port_free(base + i) for i in range(len(NODE_NAMES))):
            return base
    raise SlurmClusterError("no free port range for slurmd near 17001")


def slurm_conf_text(root: Path, host: str, ctld_port: int, slurmd_base_port: int,
                    munge_socket: Path) -> str:
    """The slurm.conf of the local cluster (multiple-slurmd, linuxproc, cons_tres, no accounting)."""
    last = slurmd_base_port + len(NODE_NAMES) - 1
    return f"""\
ClusterName=nereusci
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10,socket={munge_socket}
SlurmctldPort={ctld_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=pmi2
ReturnToService=1
SlurmdTimeout=10
SlurmctldTimeout=30
MessageTimeout=5
InactiveLimit=0
KillWait=2
MinJobAge=300
SlurmdParameters=config_overrides
NodeName=n[1-{len(NODE_NAMES)}] NodeHostname={host} NodeAddr=127.0.0.1 Port=[{slurmd_base_port}-{last}] CPUs={NODE_CPUS} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=nvidia Nodes=n1 MaxTime=INFINITE State=UP
PartitionName=amd Nodes=n[2-{len(NODE_NAMES)}] MaxTime=INFINITE State=UP
"""


@dataclass
class LocalSlurm:
    """A running local cluster; ``env`` holds what a client needs (SLURM_CONF)."""

    root: Path
    conf_path: Path
    nodes: tuple[str, ...] = NODE_NAMES
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf_path)
        return env

    def run(self, *argv: str, timeout_s: float = 20.0, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
        # A Slurm client now and then dies of SIGPIPE when slurmctld drops its connection under
        # load, or gets no answer in time while 6 MPI ranks spin on 2 cores; queries are retried
        # (a submission is not: it might have been accepted).
        attempts = 1 if argv[0] == "sbatch" else 4
        for attempt in range(attempts):
            try:
                res = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                                     timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                if attempt == attempts - 1:
                    raise
                time.sleep(2.0)
                continue
            if res.returncode != -signal.SIGPIPE or attempt == attempts - 1:
                break
            time.sleep(0.5)
        if check:
            res.check_returncode()
        return res

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for log in sorted((self.root / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"== {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    def idle_node_count(self) -> int:
        res = self.run("sinfo", "-h", "-t", "idle", "-o", "%D", check=False, timeout_s=10)
        text = res.stdout.strip()
        return int(text) if text.isdigit() else 0

    def wait_idle(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.idle_node_count() == count:
                return
            time.sleep(0.25)
        raise SlurmClusterError(f"sinfo never showed {count} idle nodes\n{self.log_tail()}")

    def wait_queue_empty(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip():
            if time.monotonic() > deadline:
                raise AssertionError("jobs still queued")
            time.sleep(0.25)

    def resume_all(self) -> None:
        """Return every node to service (a test that downed one leaves it usable again)."""
        hostlist = f"n[1-{len(self.nodes)}]"
        self.run("scontrol", "update", f"nodename={hostlist}", "state=resume", check=False)

    def stray_pids(self) -> list[int]:
        """Processes carrying this cluster's SLURM_CONF (slurmstepd and job tasks that outlived
        their slurmd after a hard test failure)."""
        marker = f"SLURM_CONF={self.conf_path}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                found.append(int(entry.name))
        return found

    def node_pids(self, node: str) -> list[int]:
        """Every process of emulated node ``node``: its slurmd, the slurmstepd of its steps
        (they hold files in its spool directory) and its tasks (SLURMD_NODENAME)."""
        spool = str(self.root / "spool" / node)
        marker = f"SLURMD_NODENAME={node}".encode()
        found = []
        slurmd = self.procs.get(f"slurmd-{node}")
        if slurmd is not None and slurmd.poll() is None:
            found.append(slurmd.pid)
        for pid in self.stray_pids():
            if pid in found:
                continue
            proc = Path("/proc", str(pid))
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
                fds = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
                cwd = os.readlink(proc / "cwd")
            except OSError:
                continue
            if marker in environ or cwd.startswith(spool) or any(f.startswith(spool) for f in fds):
                found.append(pid)
        return found

    def kill_node(self, node: str) -> list[int]:
        """SIGKILL every process of ``node`` (a node crash); returns the pids killed."""
        pids = self.node_pids(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        slurmd = self.procs.get(f"slurmd-{node}")
        if slurmd is not None:
            slurmd.wait(timeout=10)
        return pids

    def start_slurmd(self, node: str) -> None:
        """(Re)start the slurmd of ``node`` (after kill_node: the node boots again)."""
        proc = self.procs.get(f"slurmd-{node}")
        if proc is not None and proc.poll() is None:
            return
        log = open(self.root / "log" / f"slurmd-{node}.out.log", "ab")  # noqa: SIM115
        self.procs[f"slurmd-{node}"] = subprocess.Popen(
            [_exe("slurmd"), "-D", "-f", str(self.conf_path), "-N", node], env=self.env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        # slurmd first, then slurmctld, then munged: each by the pid we started.
        order = [n for n in self.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs.clear()
        for pid in self.stray_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _start_munged(root: Path) -> tuple[subprocess.Popen[bytes], Path]:
    mdir = root / "munge"
    mdir.mkdir(mode=0o700)
    munge = pwd.getpwnam("munge")
    key = mdir / "munge.key"
    system_key = Path("/etc/munge/munge.key")
    if system_key.is_file() and system_key.stat().st_size >= 32:
        shutil.copyfile(system_key, key)
    else:
        key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    for path in (mdir, key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
    sock = mdir / "munge.socket"
    argv = [_exe("munged"), "--foreground", "--force",
            f"--socket={sock}", f"--key-file={key}", f"--pid-file={mdir}/munged.pid",
            f"--log-file={mdir}/munged.log", f"--seed-file={mdir}/munged.seed"]
    log = open(root / "log" / "munged.out.log", "wb")  # noqa: SIM115 - lives as long as munged
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            user=munge.pw_uid, group=munge.pw_gid, extra_groups=[])
    deadline = time.monotonic() + 10
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SlurmClusterError("munged did not start: "
                                    + (root / "log" / "munged.out.log").read_text())
        time.sleep(0.05)
    return proc, sock


def start_local_slurm(root: Path | None = None, timeout_s: float = 40.0) -> LocalSlurm:
    """Start munged, slurmctld and three slurmd in a fresh directory; wait for 3 idle nodes."""
    reason = missing_requirements()
    if reason is not None:
        raise SlurmClusterError(reason)
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="nereus-slurm-"))
    os.chmod(root, 0o755)  # munged (user munge) must traverse it
    for sub in ("state", "log", *(f"spool/{n}" for n in NODE_NAMES)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    cluster = LocalSlurm(root=root, conf_path=conf)
    try:
        munged, sock = _start_munged(root)
        cluster.procs["munged"] = munged
        conf.write_text(slurm_conf_text(root, socket.gethostname().split(".")[0], _free_port(),
                                        _slurmd_base_port(), sock))
        env = cluster.env

        def daemon(name: str, argv: list[str]) -> None:
            log = open(root / "log" / f"{name}.out.log", "wb")  # noqa: SIM115
            cluster.procs[name] = subprocess.Popen(argv, env=env, stdout=log,
                                                   stderr=subprocess.STDOUT,
                                                   start_new_session=True)

        daemon("slurmctld", [_exe("slurmctld"), "-D", "-c", "-f", str(conf)])
        for node in NODE_NAMES:
            daemon(f"slurmd-{node}", [_exe("slurmd"), "-D", "-f", str(conf), "-N", node])
        deadline = time.monotonic() + timeout_s
        while cluster.idle_node_count() != len(NODE_NAMES):
            dead = [n for n, p in cluster.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise SlurmClusterError(f"cluster did not come up (exited: {dead})\n"
                                        + cluster.log_tail())
            time.sleep(0.25)
    except BaseException:
        cluster.stop()
        raise
    return cluster


# ---- waiting on jobs of the cluster (the slurm tests) ----

def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll ``check`` until true; every 0.2 s, or every 2 s on waits over 5 minutes (so the
    test's own queries do not load slurmctld on a busy 2-core machine)."""
    interval_s = 0.2 if timeout_s <= 300 else 2.0
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def job_info(cluster: LocalSlurm, job_id: str) -> JobInfo:
    return parse_job_record(cluster.run("scontrol", "show", "job", "-o", job_id).stdout)


def wait_job(cluster: LocalSlurm, job_id: str, states: tuple[str, ...],
             timeout_s: float = 60.0) -> JobInfo:
    found: list[JobInfo] = []

    def done() -> bool:
        found.append(job_info(cluster, job_id))
        return found[-1].state in states

    try:
        wait_for(f"job {job_id} in {states}", done, timeout_s)
    except AssertionError:
        raise AssertionError(f"job {job_id}: {found[-1] if found else None}\n"
                             f"{cluster.log_tail()}") from None
    return found[-1]
