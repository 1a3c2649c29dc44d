"""A real single-node SLURM in a temporary folder: Debian's ``munge`` and ``slurm-wlm``, three daemons started and
stopped by their process ids (tests/test_instructor_slurm.py, ``python -m benchmarks grading``).

Everything SLURM reads or writes lives in the folder: its config (``SLURM_CONF`` points every SLURM command at it),
its state, its spool, munge's key and socket (``AuthInfo=socket=...``), the daemons' logs. The node is this machine
as the daemons see it (its short host name, on loopback), its 2 CPUs and less memory than it has, so slurmd never
drains it for having less than it declared. The machine's own munge and SLURM services are never used or touched.

    with single_node_slurm(folder) as slurm:   # os.environ["SLURM_CONF"] is set inside
        subprocess.run(["sbatch", ...])
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "docs" / "slurm" / "jobqueue.yaml"  # the README's configuration file
JOB_NAME = "labkit-grade"  # its jobs' name
DAEMONS = ("munged", "slurmctld", "slurmd")
SLURM_PROGRAMS = (*DAEMONS, "sbatch", "squeue", "scancel", "sinfo")


def why_not_here() -> str | None:
    """Why this machine cannot run the test's SLURM, or None when it can."""
    if os.geteuid() != 0:
        return "a single-node SLURM needs root (slurmd starts jobs as their user): run the test as root"
    missing = [program for program in SLURM_PROGRAMS if shutil.which(program) is None]
    if missing:
        return (f"{', '.join(missing)} not installed: apt-get install slurm-wlm munge (make setup does, as root)")
    return None


def _why_no_jobqueue() -> str | None:
    try:
        import dask_jobqueue  # noqa: F401 - only whether it is there
    except ImportError:
        return "dask-jobqueue is not installed: pip install \"labkit[slurm]\" (make setup does)"
    return None


NO_JOBQUEUE = _why_no_jobqueue()
NO_SLURM = NO_JOBQUEUE or why_not_here()


def site_config(folder: Path, partition: str, **extra) -> Path:
    """The README's jobqueue.yaml with its "your site" lines set for the test's SLURM (the partition; loopback for
    the network) and ``extra`` on top, in ``folder``: the folder to name in DASK_CONFIG."""
    import yaml

    text = RECIPE.read_text()
    marked = [line.split(":")[0].strip() for line in text.splitlines() if "# your site" in line]
    assert marked == ["queue", "interface"], marked  # the README tells the reader to change these two, no other
    config = yaml.safe_load(text)
    config["jobqueue"]["slurm"].update({"queue": partition, "interface": "lo", **extra})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "jobqueue.yaml").write_text(yaml.safe_dump(config))
    return folder


def our_jobs(states: str = "PENDING,RUNNING,CONFIGURING,COMPLETING") -> list[str]:
    """The ids of labkit's jobs in those states, oldest first."""
    listed = subprocess.run(["squeue", "--noheader", f"--name={JOB_NAME}", f"--states={states}", "--format=%i"],
                            capture_output=True, text=True, check=True)
    return sorted(listed.stdout.split(), key=int)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _memory_mb() -> int:
    with open("/proc/meminfo") as meminfo:
        total_kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    return total_kb // 1024 * 3 // 4  # declared below what the machine has: slurmd drains a node that has less


def slurm_conf(folder: Path, node: str, cpus: int, munge_socket: Path) -> str:
    """A single-node slurm.conf: this machine as node ``node`` on loopback, root's daemons, everything in folder."""
    return "\n".join([
        "ClusterName=labkit-test",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", f"AuthInfo=socket={munge_socket}",
        "CredType=cred/munge",
        f"StateSaveLocation={folder / 'state'}", f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}", f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}", f"SlurmdLogFile={folder / 'slurmd.log'}",
        # No cgroup plugins: the test's machine may not delegate cgroups (the run with proctrack/cgroup and
        # task/cgroup worked, the sandbox's cgroups nesting inside the job's; not repeated here).
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
        "ReturnToService=2", "KillWait=5", "MinJobAge=300", "InactiveLimit=0", "SlurmdTimeout=60",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_memory_mb()} State=UNKNOWN",
        f"PartitionName=grading Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _start(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as output:
        return subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    """Stop a process we started, by its id (its session: a daemon, or a nanny and its worker)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_for(check, what: str, logs: list[Path], processes: list[subprocess.Popen], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline or any(process.poll() is not None for process in processes):
            tails = "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-1500:]}" for log in logs if log.exists())
            raise RuntimeError(f"the test's SLURM did not come up: {what}\n{tails}")
        time.sleep(0.3)


@contextlib.contextmanager
def single_node_slurm(folder: Path) -> Iterator[dict]:
    """munged, slurmctld and slurmd from folder; yields {"node", "partition", "folder", "conf"}; stops them all
    (after cancelling every job left) by their ids. SLURM_CONF is set in os.environ meanwhile (SLURM commands
    and dask-jobqueue's sbatch read it)."""
    folder = Path(folder)
    for sub in ("state", "spool", "munge"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    # munged wants every folder above its socket searchable by all (pytest's temporary folders are not): the
    # socket goes in a folder of its own under /tmp, removed at the end.
    socket_folder = Path(tempfile.mkdtemp(prefix="labkit-munge-"))
    socket_folder.chmod(0o755)
    munge_socket = socket_folder / "munge.socket"
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, node, os.cpu_count() or 1, munge_socket))
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    processes: list[subprocess.Popen] = []
    logs = [folder / "munged.log", folder / "slurmctld.log", folder / "slurmd.log", folder / "daemons.log"]
    try:
        processes.append(_start(["munged", "--foreground", f"--socket={munge_socket}",
                                 f"--key-file={key}", f"--pid-file={folder / 'munge' / 'munged.pid'}",
                                 f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munge' / 'seed'}"],
                                folder / "daemons.log"))
        _wait_for(lambda: munge_socket.exists(), "munged made no socket", logs, processes)
        processes.append(_start(["slurmctld", "-D", "-i", "-f", str(conf)], folder / "daemons.log"))
        processes.append(_start(["slurmd", "-D", "-f", str(conf), "-N", node], folder / "daemons.log"))

        def node_idle() -> bool:
            state = subprocess.run(["sinfo", "--noheader", "--format=%T", "--nodes", node],
                                   capture_output=True, text=True)
            return state.returncode == 0 and state.stdout.strip().rstrip("*") == "idle"

        _wait_for(node_idle, f"node {node} never became idle (sinfo)", logs, processes)
        yield {"node": node, "partition": "grading", "folder": folder, "conf": conf}
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--full", "--partition", "grading"], timeout=30, capture_output=True)
        for process in reversed(processes):
            stop(process)
        shutil.rmtree(socket_folder, ignore_errors=True)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
