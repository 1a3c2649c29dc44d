"""A class graded on a batch cluster: ``labkit grade FOLDER --cluster slurm --jobs N`` (dask-jobqueue).

The cluster is built from dask-jobqueue's own configuration (``~/.config/dask/jobqueue.yaml``, the file SLURM users
of Dask already keep: queue, account, memory, walltime, interface, job directives), with what labkit needs on top,
each choice printed once:

- one single-threaded worker per job (``cores=1, processes=1``), the nanny's memory limit off (``--memory-limit 0``:
  the sandbox bounds each notebook, which the nanny cannot see);
- a ``--lifetime`` under the walltime, computed from it, and workers that stop taking submissions when one more
  might not finish before it (:class:`~labkit.instructor.cluster.grader_plugin.GraderPlugin`'s ``leave_after_s``):
  a job's end never cuts a submission short;
- TLS with certificates made for the run (the scheduler runs in this process; dask-jobqueue writes the workers'
  copies to a folder beside the output, removed when the run ends);
- the scheduler's worker-saturation at 1.0 and its allowed failures (as for the local cluster);
- ``adapt(minimum_jobs=N, maximum_jobs=N)``: a job that ends (its lifetime, a ``scancel``, a node lost) is replaced,
  where ``scale(jobs=N)`` would leave the class waiting on fewer workers, or none.

Why a job's worker never joined is read from its job's error file (dask-jobqueue's ``log-directory``) while the
client waits: :class:`JobWatch`. SLURM is tested on a real single-node cluster (tests/test_instructor_slurm.py);
PBS, SGE and LSF go through the same code with dask-jobqueue's other classes and are untested.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from labkit.instructor.grader.settings import CLUSTERS


def walltime_seconds(walltime: str, setting: str = "walltime") -> int:
    """Seconds in a batch system's walltime: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``.

    >>> walltime_seconds("08:00:00"), walltime_seconds("30"), walltime_seconds("1-02:00"), walltime_seconds("90:00")
    (28800, 1800, 93600, 5400)
    """
    text = str(walltime).strip()
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        raise ValueError(f"{setting} must be a batch walltime (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS), "
                         f"got {walltime!r}")
    days, *parts = match.groups()
    numbers = [int(part) for part in parts if part is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (numbers + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(numbers) == 1:  # SLURM reads a lone number as minutes
        return numbers[0] * 60
    if len(numbers) == 2:
        return numbers[0] * 60 + numbers[1]
    return (numbers[0] * 60 + numbers[1]) * 60 + numbers[2]


def lifetime_seconds(walltime_s: int) -> int:
    """The workers' ``--lifetime``: the walltime less 2 % (at least a minute), for the worker to leave cleanly before
    the batch system kills its job. 8 hours give 28,224 s (470 minutes).

    >>> lifetime_seconds(28800), lifetime_seconds(3600)
    (28224, 3528)
    """
    return walltime_s - max(60, walltime_s // 50)


def import_cluster_class(kind: str) -> Any:
    """dask-jobqueue's cluster class for ``kind``, imported without letting it take Ctrl-C.

    dask-jobqueue 0.9's ``__init__`` imports its ``runner`` module, which replaces Python's SIGINT handler with
    ``sys.exit()``: Ctrl-C would then end ``labkit grade`` silently with rc 0, no reports and no gradebook. The
    handler this process had is put back at once.
    """
    if kind not in CLUSTERS[1:]:
        raise ValueError(f"--cluster must be local or one of {', '.join(CLUSTERS[1:])}, got {kind!r}")
    in_main_thread = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT)
    try:
        import dask_jobqueue
    except ImportError as error:
        raise ValueError(f"--cluster {kind} needs dask-jobqueue: pip install \"labkit[instructor,slurm]\" "
                         f"({error})") from None
    except ValueError as error:  # its signal.signal() outside the main thread
        raise ValueError(f"--cluster {kind}: dask-jobqueue sets a signal handler when first imported, which only "
                         f"the main thread may do; import dask_jobqueue there first ({error})") from None
    finally:
        if in_main_thread and handler is not None:
            signal.signal(signal.SIGINT, handler)
    return getattr(dask_jobqueue, f"{kind.upper()}Cluster")  # its config section has the same name


@dataclass
class JobPlan:
    """What labkit asks of dask-jobqueue, and the lines that tell the instructor."""
    kind: str
    jobs: int
    options: dict[str, Any]  # keyword arguments of the cluster class, on top of its configuration
    lifetime_s: int
    leave_after_s: float  # a worker this old takes no new submission (one more might outlive its lifetime)
    log_directory: Path
    choices: list[str] = field(default_factory=list)


def plan_jobs(kind: str, jobs: int, out: Path, deadline_s: float, memory_bytes: int) -> JobPlan:
    """The cluster labkit builds for ``--cluster kind --jobs jobs``: dask-jobqueue's configuration for ``kind``,
    labkit's requirements on top. ``deadline_s`` is how long one submission may hold a worker; ``memory_bytes``
    what a job needs when the configuration names no memory."""
    import dask
    from dask.utils import format_bytes, parse_bytes

    import_cluster_class(kind)  # its defaults (jobqueue.yaml in the package) under the user's file
    config = dask.config.get(f"jobqueue.{kind}", default={}) or {}
    source = f"jobqueue.{kind}"
    walltime = config.get("walltime")
    if not walltime:
        raise ValueError(f"{source}.walltime is not set (~/.config/dask/jobqueue.yaml): labkit computes the "
                         "workers' lifetime from it")
    walltime_s = walltime_seconds(walltime, f"{source}.walltime")
    lifetime_s = lifetime_seconds(walltime_s)
    leave_after_s = lifetime_s - deadline_s
    if leave_after_s <= 0:
        raise ValueError(f"{source}.walltime {walltime!r} ({walltime_s} s) is too short: one submission may hold "
                         f"its worker {deadline_s:.0f} s (--wall-seconds plus the answering and judging time) and "
                         f"the workers live {lifetime_s} s; give a walltime of at least "
                         f"{int(deadline_s + max(60, deadline_s // 49)) + 60} s or a smaller --wall-seconds")
    choices = [f"{kind}: {jobs} jobs of one single-threaded worker each (cores=1, processes=1), kept at {jobs}: a job "
               "that ends is replaced (adapt, minimum and maximum jobs)"]
    memory = config.get("memory")
    if not memory:
        memory = format_bytes(memory_bytes).replace(" ", "")
        choices.append(f"{kind}: memory {memory} per job ({source}.memory not set): --total-memory-mb and the "
                       "grader's own 2 GiB")
    elif parse_bytes(memory) < memory_bytes:
        choices.append(f"{kind}: memory {memory} per job (from {source}.memory), less than --total-memory-mb and "
                       f"the grader's own 2 GiB ({format_bytes(memory_bytes)}): a notebook near its limit may be "
                       "killed by the batch system, then retried; kept as configured")
    else:
        choices.append(f"{kind}: memory {memory} per job (from {source}.memory)")
    choices.append(f"{kind}: walltime {walltime} (from {source}.walltime); workers live {lifetime_s} s "
                   f"(--lifetime) and take no new submission after {leave_after_s:.0f} s, so none is cut short")
    choices.append(f"{kind}: nanny memory limit off (--memory-limit 0): the wall bounds each notebook")
    log_directory = Path(config.get("log-directory") or Path(out).resolve().with_name(Path(out).name + "-jobs"))
    choices.append(f"{kind}: each job's output and errors in {log_directory}"
                   + ("" if config.get("log-directory") else f" ({source}.log-directory not set)"))
    shared = config.get("shared-temp-directory") or str(log_directory)
    choices.append(f"{kind}: TLS with certificates made for this run; the workers' copies in {shared} until it ends")
    interface = config.get("interface")
    scheduler_options = config.get("scheduler-options") or {}
    if not interface and "host" not in scheduler_options and "interface" not in scheduler_options:
        choices.append(f"{kind}: the scheduler listens on every interface of this machine ({source}.interface not "
                       "set), TLS only")
    extra = [*config.get("worker-extra-args", []), "--memory-limit", "0", "--lifetime", f"{lifetime_s}s"]
    options = {"cores": 1, "processes": 1, "memory": memory, "worker_extra_args": extra,
               "log_directory": str(log_directory), "shared_temp_directory": shared}
    return JobPlan(kind, jobs, options, lifetime_s, leave_after_s, log_directory, choices)


class JobWatch:
    """Why a job's worker has not joined, read from the job's error file while the client waits."""

    def __init__(self, cluster: Any, kind: str) -> None:
        self.cluster, self.kind = cluster, kind
        self.explained: dict[str, str] = {}  # job id -> reason, once each

    def log_of(self, job: Any) -> Path:
        """dask-jobqueue's error file of a job (``#SBATCH -e DIR/NAME-%J.err``)."""
        return Path(job.log_directory) / f"{job.job_name or 'worker'}-{job.job_id}.err"

    def log_of_worker(self, worker: str) -> Path | None:
        """The error file of the job whose worker is named (or, failing that, at the address) ``worker``, if that
        worker is one of this cluster's. The name comes with the worker's own message: the cluster's copy of the
        scheduler's worker list may not hold a worker that has only just joined (it did not, under load)."""
        job = self.cluster.workers.get(worker)
        if job is None:
            try:
                workers = self.cluster.scheduler_info["workers"]
            except (AttributeError, KeyError, TypeError):
                return None
            job = self.cluster.workers.get(str(workers.get(worker, {}).get("name", "")))
        return self.log_of(job) if job is not None and getattr(job, "job_id", None) else None

    def new_reasons(self, joined_names: set[str]) -> list[str]:
        """A line for each job not seen before that ended, or wrote an error, without its worker joining."""
        lines = []
        jobs = {str(job.job_id): job for name, job in list(self.cluster.workers.items())
                if getattr(job, "job_id", None) and name not in joined_names}
        states = self._states(list(jobs)) if jobs else {}
        for job_id, job in jobs.items():
            if job_id in self.explained:
                continue
            log = self.log_of(job)
            error = _last_error(log)
            state = states.get(job_id)
            if error is None and state not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                               "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"):
                continue
            reason = error or f"its job ended ({state}) and its log says nothing more"
            self.explained[job_id] = reason
            lines.append(f"job {job_id} ended before its worker joined: {reason} (its log: {log})")
        return lines

    def _states(self, job_ids: list[str]) -> dict[str, str]:
        if self.kind != "slurm" or shutil.which("squeue") is None:
            return {}  # PBS, SGE, LSF: the error file alone (untested)
        try:
            result = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i %T",
                                     f"--jobs={','.join(job_ids)}"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        return dict(line.split(None, 1) for line in result.stdout.splitlines() if len(line.split(None, 1)) == 2)


ERROR_LINE = re.compile(r"^(?:[A-Za-z_.]*(?:Error|Exception)\b.*|Error: .*|.*\b(?:error|ERROR)\b.*)$")


def _last_error(log: Path) -> str | None:
    """The last line of a job's error file that reads as an error (an exception, a command-line error)."""
    try:
        text = log.read_text(errors="replace")[-20000:]
    except OSError:
        return None
    found = [line.strip() for line in text.splitlines() if ERROR_LINE.match(line.strip())]
    return found[-1][:400] if found else None


def make_cluster(plan: JobPlan, scheduler_config: dict[str, Any]) -> Any:
    """dask-jobqueue's cluster of ``plan`` (no job submitted yet), its scheduler in this process with
    ``scheduler_config`` in force when it starts."""
    import dask
    from distributed import Security

    cluster_class = import_cluster_class(plan.kind)
    plan.log_directory.mkdir(parents=True, exist_ok=True)
    Path(plan.options["shared_temp_directory"]).mkdir(parents=True, exist_ok=True)
    prologue = [*(dask.config.get(f"jobqueue.{plan.kind}.job-script-prologue", default=[]) or []),
                # not daemonic, as the local cluster's workers: a grader may start processes of its own
                "export DASK_DISTRIBUTED__WORKER__DAEMON=False"]
    with dask.config.set(scheduler_config):  # read when the scheduler starts, here
        return cluster_class(security=Security.temporary(), protocol="tls://", job_script_prologue=prologue,
                             **plan.options)


@contextlib.contextmanager
def open_jobqueue_cluster(plan: JobPlan, say: Callable[[str], None], scheduler_config: dict[str, Any]) -> Iterator[Any]:
    """The cluster of ``plan``, kept at ``plan.jobs`` jobs (its choices said first); every job cancelled when the
    block ends."""
    for line in plan.choices:
        say(line)
    cluster = make_cluster(plan, scheduler_config)
    try:
        say(f"{plan.kind}: scheduler at {cluster.scheduler_address}")
        cluster.adapt(minimum_jobs=plan.jobs, maximum_jobs=plan.jobs)
        yield cluster
    finally:
        cluster.close(timeout=60)
