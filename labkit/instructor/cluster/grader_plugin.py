"""What makes a Dask worker a grader: :class:`GraderPlugin`, its checks, and the secret it holds.

Every worker of a class run gets the plugin before it takes work (:mod:`labkit.instructor.cluster.workers`). It
checks that its labkit (version and code), its torch and its model cache are the client's, prepares the model
cache once per machine (under a file lock, so workers sharing a disk never race), that it can wall off submissions
(bubblewrap), and that it holds the client's secret; a worker that fails a check says why (an event the client
prints) and leaves the cluster. A batch job's worker near the end of its lifetime takes no new submission.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

PLUGIN = "labkit-grader"  # its name on every worker
REFUSED = "labkit-refused"  # the event a worker that refuses sends the client
LEAVING = "labkit-leaving"  # ... and one that leaves before its lifetime
PENDING = "not set up yet"  # a worker whose checks are still running
GRADER_MEMORY_BYTES = 2 * 2**30  # what the grader process itself needs (the model for the judge, the libraries)


def prepare_model_cache() -> str:
    """Build the embedded model's cache if it is missing or broken (one process per machine at a time, under a
    file lock), then return a hash of its manifest's files: the same weights give the same hash."""
    import fcntl

    from labkit.runtime.models import gguf_path, load_model
    from labkit.runtime.sources import EMBEDDED, known_models
    from labkit.runtime.weights_cache import MANIFEST, cache_dir, cache_problem, expected_header

    source = known_models()[EMBEDDED]
    directory = cache_dir(source)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / ".labkit-prepare.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if cache_problem(directory, expected_header(source, gguf_path(source))):
            load_model(progress=False)
        files = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))["files"]
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def machine_identity() -> dict[str, str]:
    """What every worker must share with the client: labkit's version and code, torch's version, the model cache."""
    import torch

    import labkit
    from labkit.instructor.grader.results import code_identity

    return {"labkit": labkit.__version__, "labkit code": code_identity(), "torch": torch.__version__,
            "model cache": prepare_model_cache()}


class GraderPlugin(WorkerPlugin):
    """Makes a worker a grader, or has it refuse (the reason goes to the client as a ``labkit-refused`` event)."""

    idempotent = False

    def __init__(self, expected: dict[str, str], isolate: bool, secret_id: str, *, secret: bytes | None = None,
                 secret_file: str | None = None, leave_after_s: float | None = None) -> None:
        self.expected, self.isolate, self.secret_id = expected, isolate, secret_id
        self.secret, self.secret_file = secret, secret_file
        # A batch job's worker this many seconds old takes no new submission and leaves (its job is replaced):
        # Dask's --lifetime would cut the submission it runs (dask-jobqueue#122). None: no lifetime.
        self.leave_after_s, self.leaving = leave_after_s, False
        self.problem: str | None = PENDING

    async def setup(self, worker: Any) -> None:
        from labkit.instructor.wall.worker import keep_out_iri_grammars

        keep_out_iri_grammars()  # before grading imports nbformat: 2.9 s of CPU per worker on a 2 GHz Zen 1
        try:
            self.problem = await asyncio.get_running_loop().run_in_executor(None, self._check, worker)
        except Exception as error:  # noqa: BLE001 - any failure of the checks is a refusal with its reason
            self.problem = f"its checks failed: {type(error).__name__}: {error}"
        if self.problem:
            worker.log_event(REFUSED, {"worker": worker.address, "name": str(worker.name), "problem": self.problem})
            # Leave the cluster (the nanny too, so it is not restarted), after the client had time to ask why.
            asyncio.get_running_loop().call_later(
                2, lambda: asyncio.ensure_future(worker.close(nanny=True, reason=f"labkit: {self.problem}")))

    def _check(self, worker: Any) -> str | None:
        import labkit
        from labkit.instructor.grader.results import code_identity, secret_identity

        if labkit.__version__ != self.expected["labkit"]:
            return f"labkit {labkit.__version__} here, {self.expected['labkit']} on the client"
        if code_identity() != self.expected["labkit code"]:
            return (f"labkit's code here (hash {code_identity()}) differs from the client's "
                    f"({self.expected['labkit code']}): the same version, other files")
        import torch

        if torch.__version__ != self.expected["torch"]:
            return f"torch {torch.__version__} here, {self.expected['torch']} on the client"
        limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
        if limit and limit < GRADER_MEMORY_BYTES:
            return (f"its memory limit ({limit / 2**30:.1f} GiB) leaves the grader process no room (it needs about "
                    f"{GRADER_MEMORY_BYTES // 2**30} GiB; start workers with --memory-limit 0: the wall bounds "
                    "each notebook)")
        if self.isolate:
            from labkit.instructor.wall.sandbox import isolation_problem

            problem = isolation_problem()
            if problem:
                return f"it cannot wall off submissions: {problem}"
        if self.secret is None:
            from labkit.instructor.grader.judging import grading_secret

            try:
                self.secret = grading_secret(Path(self.secret_file))
            except (OSError, ValueError) as error:
                return f"it cannot read the secret file {self.secret_file}: {error}"
        if secret_identity(self.secret) != self.secret_id:
            return f"its secret file {self.secret_file} does not hold the client's secret"
        cache = prepare_model_cache()
        if cache != self.expected["model cache"]:
            return f"its model cache (hash {cache}) differs from the client's ({self.expected['model cache']})"
        return None

    def should_leave(self, worker: Any, age_s: float | None = None) -> bool:
        """Whether this worker (``age_s`` old) is too old to start another submission; then it leaves, once."""
        if self.leave_after_s is None:
            return False
        if age_s is None:
            import psutil

            age_s = time.time() - psutil.Process().create_time()  # Dask's --lifetime counts from the start
        if age_s > self.leave_after_s and not self.leaving:
            self.leaving = True
            worker.log_event(LEAVING, {"worker": worker.address, "age_s": round(age_s)})
            worker.loop.add_callback(worker.close_gracefully, reason="labkit: leaving before its lifetime")
        return self.leaving


def current_plugin(dask_worker: Any = None) -> GraderPlugin | None:
    """The grader plugin of ``dask_worker`` (by default, the worker running this task), or None."""
    return (dask_worker or get_worker()).plugins.get(PLUGIN)


def plugin_problem(dask_worker: Any = None) -> str | None:
    plugin = current_plugin(dask_worker)
    return "labkit's grader plugin is not installed" if plugin is None else plugin.problem
