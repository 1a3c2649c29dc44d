"""Where a class is graded: Dask distributed workers, each a trusted grader that walls off every submission.

``labkit grade FOLDER --jobs N`` starts a local cluster (N single-threaded worker processes on this machine, TLS
with certificates made for the run); ``--cluster slurm --jobs N`` N batch jobs of one worker each
(:mod:`labkit.instructor.cluster.jobqueue`); ``--scheduler tls://host:8786`` uses a running one (Kubernetes through
dask-kubernetes, or ``dask scheduler`` / ``dask worker`` by hand). Every way:

- every worker gets :class:`~labkit.instructor.cluster.grader_plugin.GraderPlugin` before it takes work: a worker
  whose labkit, torch, model cache, wall or secret is not the client's says why and leaves the cluster; nothing is
  graded without the wall unless the instructor said ``--no-isolation``.
- the secret travels once per worker, inside the plugin, and only over TLS; over plain TCP (allowed on loopback,
  elsewhere only when told in so many words) each worker reads it from its own file and only a hash of it
  travels. Task arguments carry the notebook's bytes, its file name and the limits, never the secret.
- a worker that dies mid-submission has the submission run elsewhere, at most ``ALLOWED_FAILURES`` more times
  (the scheduler's ``allowed-failures``), then Dask's ``KilledWorker`` becomes that learner's row note. A learner's
  own timeout, memory limit or crash is a grade the sandbox decided, returned once and never retried; the nanny's
  memory limit is off for the local cluster (the sandbox bounds the notebook, which the nanny cannot see).

Dask keeps no state across a scheduler restart and drops a disconnected client's tasks: resuming is
:mod:`labkit.instructor.grader.results`' job.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Iterator

from distributed import Client, LocalCluster, Reschedule, Security, get_worker, wait

from labkit.instructor.cluster.grader_plugin import LEAVING, PENDING, REFUSED, current_plugin, plugin_problem

STARTED = "labkit-started"
ALLOWED_FAILURES = 3  # a submission whose worker dies 4 times is reported, not retried for ever
# One submission per worker thread, none queued behind it on the worker: when a submission kills its worker,
# Dask counts every task assigned to that worker as suspicious, so a queued classmate would lose one of its
# allowed failures to a death it had no part in (seen: an honest row became "could not be graded").
WORKER_SATURATION = 1.0


class NoUsableWorkers(RuntimeError):
    """Every worker of the cluster refused to grade (each one's reason is in the message)."""


def is_loopback(address: str) -> bool:
    """Whether a scheduler address stays on this machine.

    >>> is_loopback("tcp://127.0.0.1:8786"), is_loopback("tls://localhost:8786"), is_loopback("tcp://10.0.0.5:8786")
    (True, True, False)
    """
    host = urllib.parse.urlsplit(address if "://" in address else f"tcp://{address}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_scheduler(address: str, *, insecure_plain_tcp: bool = False) -> str:
    """The address's protocol (``tls`` or ``tcp``); a plain-TCP address off this machine is refused unless told."""
    scheme = address.split("://", 1)[0] if "://" in address else "tcp"
    if scheme not in ("tcp", "tls"):
        raise ValueError(f"scheduler must be a tcp:// or tls:// address, got {address!r}")
    if scheme == "tcp" and not is_loopback(address) and not insecure_plain_tcp:
        raise ValueError(
            f"scheduler {address!r} is plain TCP off this machine: anyone who reaches it can run code on every "
            "worker. Use tls:// with certificates (--tls-ca-file, --tls-cert, --tls-key), or say "
            "--insecure-plain-tcp")
    return scheme


def grade_task(name: str, data: bytes, settings: Any, grader: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Runs on a worker: one submission (its file name and bytes) graded, walled off, with ``settings`` and the
    worker's own secret. ``{"report": SubmissionReport}``, or ``{"error": ...}`` when the grader itself failed (not
    stored: the next run tries again)."""
    plugin = current_plugin()
    if plugin is None or plugin.problem or plugin.should_leave(get_worker()):
        raise Reschedule()  # a worker that refused, or is too old for one more, takes no submission
    worker = get_worker()
    worker.log_event(STARTED, {"key": worker.get_current_task(), "worker": worker.address})
    if grader is None:
        from labkit.instructor.grader.grading import grade_notebook as grader
    with tempfile.TemporaryDirectory(prefix="labkit-submission-") as scratch:
        path = Path(scratch) / name
        path.write_bytes(data)
        try:
            return {"report": grader(path, dataclasses.replace(settings, secret=plugin.secret))}
        except Exception as error:  # noqa: BLE001 - the grader's failure is this submission's note
            return {"error": f"could not be graded: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}"}


def _stop_sandboxes() -> int:
    from labkit.instructor.wall.sandbox import stop_all

    stop_all()
    return 0


@contextlib.contextmanager
def open_client(settings: Any, *, plan: Any = None,
                say: Callable[[str], None] = print) -> Iterator[tuple[Client, bool]]:
    """A client of a local cluster of ``settings.jobs`` single-threaded worker processes (TLS on loopback with
    certificates made for this run, the nanny's memory limit off, its dashboard on a free port), of the batch
    cluster of ``plan`` (a :class:`~labkit.instructor.cluster.jobqueue.JobPlan`; its choices are said once), or of
    the running scheduler at ``settings.scheduler`` (reached with ``settings.security``).
    Yields (client, whether the connection is encrypted)."""
    import logging

    import dask

    if plan is not None:
        from labkit.instructor.cluster.jobqueue import open_jobqueue_cluster

        with open_jobqueue_cluster(plan, say, {"distributed.scheduler.allowed-failures": ALLOWED_FAILURES,
                                               "distributed.scheduler.worker-saturation": WORKER_SATURATION}) as c:
            with Client(c) as client:
                yield client, True
        return
    jobs, scheduler = settings.jobs, settings.scheduler
    if scheduler is None:
        # Workers not daemonic: a grader may start processes of its own (a daemonic process cannot).
        with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES,
                              "distributed.scheduler.worker-saturation": WORKER_SATURATION,
                              "distributed.worker.daemon": False}):
            cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, memory_limit=0,
                                   security=Security.temporary(), protocol="tls://", host="127.0.0.1",
                                   dashboard_address="127.0.0.1:0",
                                   silence_logs=logging.ERROR)
        try:
            with Client(cluster) as client:
                yield client, True
        finally:
            cluster.close(timeout=30)
        return
    scheme = check_scheduler(scheduler, insecure_plain_tcp=settings.insecure_plain_tcp)
    with Client(scheduler, security=settings.security, timeout=30) as client:
        saturation = client.run_on_scheduler(_worker_saturation)
        if saturation != WORKER_SATURATION:
            import warnings

            warnings.warn(f"the scheduler's distributed.scheduler.worker-saturation is {saturation}: a worker may "
                          "hold a second submission behind the one it runs, and when a submission kills its worker "
                          "Dask counts that classmate's death too; start the scheduler with "
                          "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION=1.0", stacklevel=3)
        yield client, scheme == "tls"


def _worker_saturation(dask_scheduler: Any) -> float:
    return dask_scheduler.WORKER_SATURATION


class ClassRun:
    """The submissions of one run on one client: a bounded number in flight, each result handed over as it comes.

    :meth:`run` takes (key, file name, load) triples, where ``load()`` returns the bytes to ship (read when the
    submission is sent, so a class never sits in memory whole), and calls ``on_done(key, outcome)`` once per key:
    ``{"report": ...}``, or ``{"error": ...}`` (the grader failed, its worker kept dying, or it held its worker past
    ``deadline_s``; nothing of these is stored, so the next run tries again).
    """

    def __init__(self, client: Client, settings: Any, grader: Callable[..., Any] | None = None, *,
                 say: Callable[[str], None] = print) -> None:
        """``settings``: the :class:`~labkit.instructor.grader.settings.GradingSettings` each worker gets (without
        the secret: :meth:`~labkit.instructor.grader.settings.GradingSettings.for_workers`)."""
        self.client, self.settings, self.grader, self.say = client, settings, grader, say
        self.deadline_s = settings.deadline_s
        self.started: dict[str, tuple[float, str]] = {}  # task key -> (when it last started, on which worker)
        self.attempts: dict[str, int] = {}
        self.refused: dict[str, str] = {}
        # a batch job's log, where there is one, from its worker's name (or address)
        self.log_of_worker: Callable[[str], Any] = lambda name: None
        client.subscribe_topic(STARTED, self._on_started)
        client.subscribe_topic(REFUSED, self._on_refused)
        client.subscribe_topic(LEAVING, self._on_leaving)

    def _on_started(self, event: tuple[float, dict[str, Any]]) -> None:
        message = event[1]
        self.attempts[message["key"]] = self.attempts.get(message["key"], 0) + 1
        self.started[message["key"]] = (time.monotonic(), message["worker"])

    def _on_refused(self, event: tuple[float, dict[str, Any]]) -> None:
        message = event[1]
        if message["worker"] not in self.refused:
            log = self.log_of_worker(message.get("name") or message["worker"])
            self.refused[message["worker"]] = message["problem"] + (f" (its log: {log})" if log else "")
            self.say(f"worker {message['worker']} refused to grade: {self.refused[message['worker']]}")

    def _on_leaving(self, event: tuple[float, dict[str, Any]]) -> None:
        message = event[1]
        self.say(f"worker {message['worker']} leaves after {message['age_s']} s, before its lifetime, between two "
                 "submissions; its job is replaced")

    @property
    def retries(self) -> int:
        """How many times a submission was started again after its worker died."""
        return sum(count - 1 for count in self.attempts.values())

    def usable_workers(self, timeout_s: float = 120, watch: Any = None, jobs: int = 0) -> int:
        """Wait for a worker to be ready; the number of workers that did not refuse (NoUsableWorkers if none).
        ``watch`` (a :class:`~labkit.instructor.cluster.jobqueue.JobWatch`) says why a batch job's worker never joined, as
        soon as its job's log shows it; once ``jobs`` jobs ended so, the wait ends."""
        deadline = time.monotonic() + timeout_s
        while True:
            if watch is not None:
                joined = {info.get("name") for info in self.client.scheduler_info()["workers"].values()}
                for line in watch.new_reasons({str(name) for name in joined}):
                    self.say(line)
                if jobs and len(watch.explained) >= jobs:
                    reasons = "; ".join(f"job {job}: {reason}" for job, reason in watch.explained.items())
                    raise NoUsableWorkers(f"no worker of the cluster can grade: {len(watch.explained)} jobs ended "
                                          f"before their workers joined: {reasons} (their logs: "
                                          f"{watch.cluster._dummy_job.log_directory})")
            states = self.client.run(plugin_problem, on_error="return")
            problems = {worker: state for worker, state in states.items()
                        if isinstance(state, str) and state != PENDING}
            for worker, problem in problems.items():
                self._on_refused((0.0, {"worker": worker, "problem": problem}))
            ready = [worker for worker, state in states.items() if state is None]
            if ready:
                return len(ready)
            if time.monotonic() > deadline or (states and len(problems) == len(states)):
                reasons = "; ".join(f"{w}: {p}" for w, p in self.refused.items()) or "no worker joined"
                if watch is not None and not self.refused:
                    reasons += f" (the jobs' logs: {watch.cluster._dummy_job.log_directory})"
                raise NoUsableWorkers(f"no worker of the cluster can grade: {reasons}")
            time.sleep(1)

    def run(self, todo: list[tuple[str, str, Callable[[], bytes]]], on_done: Callable[[str, dict[str, Any]], None],
            window: int, tick: Callable[[], None] = lambda: None) -> None:
        pending = iter(todo)
        futures: dict[Any, str] = {}

        def submit_next() -> None:
            for key, name, load in pending:
                try:
                    data = load()
                except Exception as error:  # noqa: BLE001 - a file that changed or vanished is its own note
                    on_done(key, {"error": f"could not be graded: {type(error).__name__}: {error}"})
                    continue
                futures[self.client.submit(grade_task, name, data, self.settings, self.grader, pure=False,
                                           key=f"labkit-grade-{key}")] = key
                return

        for _ in range(window):
            submit_next()
        while futures:
            try:
                done, _ = wait(list(futures), timeout=2, return_when="FIRST_COMPLETED")
            except TimeoutError:
                done = set()
            for future in done:
                key = futures.pop(future)
                on_done(key, _outcome(future))
                submit_next()
            for future, key in list(futures.items()):
                started = self.started.get(future.key)
                if started and time.monotonic() - started[0] > self.deadline_s:
                    futures.pop(future)
                    future.cancel()
                    with contextlib.suppress(Exception):  # frees the slot where the worker has a nanny
                        self.client.restart_workers([started[1]], raise_for_error=False)
                    on_done(key, {"error": f"could not be graded: it held its worker longer than "
                                           f"{self.deadline_s:.0f} s"})
                    submit_next()
            tick()

    def stop(self) -> None:
        """The instructor stopped the run: every sandbox running on a worker is killed (running tasks cannot be
        cancelled in Dask; their walls can)."""
        with contextlib.suppress(Exception):
            self.client.run(_stop_sandboxes, wait=True, on_error="ignore")


def _outcome(future: Any) -> dict[str, Any]:
    from distributed import KilledWorker

    try:
        return future.result()
    except KilledWorker as error:
        return {"error": f"could not be graded: its worker died {error.allowed_failures + 1} times (a fault of the "
                         "cluster, not of the submission; the next run tries again)"}
    except Exception as error:  # noqa: BLE001 - the cluster's failure is this submission's note
        return {"error": f"could not be graded: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}"}
