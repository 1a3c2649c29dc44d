"""How a submission is graded, and where a class is: one frozen record, the only thing the entry points take.

``labkit grade`` builds it from the command line (:mod:`labkit.instructor.cli`); a notebook is graded with
``grade_notebook(path, settings)``, a class with ``grade_class(folder, out, settings)``. What decides a report
(the labkit code, the secret's identity, the time limit, the limits, the wall) is :meth:`GradingSettings.context`,
the result store's key beside the submission's bytes. The secret never travels to a worker inside these settings
(:meth:`GradingSettings.for_workers`): a worker gets it once, from Dask's plugin over TLS, or from its own file.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.instructor.wall.kernel_limits import Limits

CLUSTERS = ("local", "slurm", "pbs", "sge", "lsf")  # where a class's workers run: here, or dask-jobqueue's batch systems
ANSWER_SECONDS_AT_LEAST = 300  # the answering step's time: the cell limit, but never less


@dataclass(frozen=True)
class GradingSettings:
    """Everything a grading run is told. A submission: its time limits, its resource limits, the wall, the
    instructor's secret. A class: how many workers, where (``cluster``, or a running ``scheduler``), how to reach
    them, and what the terminal shows."""

    cell_timeout_s: int = 120
    limits: Limits = Limits()
    isolate: bool = True  # the wall (bubblewrap); False grades without it and every report says so
    secret: bytes | None = None  # salts the random cases; None: grading_secret() when grading starts
    jobs: int = 1
    cluster: str = "local"
    scheduler: str | None = None  # a running Dask scheduler's address instead of workers of our own
    security: Any = None  # distributed.Security for a tls:// scheduler
    insecure_plain_tcp: bool = False  # allow a tcp:// scheduler off this machine
    worker_secret_file: Path | None = None  # over plain TCP, where each worker reads the secret
    bar: bool = False  # a progress bar (the command line's); else one line per submission
    dashboard: bool = False  # print the Dask dashboard's address

    def __post_init__(self) -> None:
        for name, least in (("cell_timeout_s", 1), ("jobs", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")
        if not isinstance(self.limits, Limits):
            raise ValueError(f"limits must be a Limits, got {type(self.limits).__name__}")
        if self.cluster not in CLUSTERS:
            raise ValueError(f"cluster must be one of {', '.join(CLUSTERS)}, got {self.cluster!r}")
        if self.cluster != "local" and self.scheduler is not None:
            raise ValueError(f"cluster {self.cluster!r} starts its own scheduler: give it or scheduler, not both")
        if self.secret is not None and (not isinstance(self.secret, bytes) or not self.secret):
            raise ValueError("secret must be non-empty bytes (or None: labkit's own)")

    @property
    def answer_timeout_s(self) -> int:
        return max(self.cell_timeout_s, ANSWER_SECONDS_AT_LEAST)

    @property
    def deadline_s(self) -> float:
        """How long one submission may hold a worker before the client gives up on it: its wall time, the
        answering step and the judge's time."""
        return self.limits.wall_seconds + self.answer_timeout_s + 300

    def with_secret(self) -> GradingSettings:
        """These settings with the secret resolved (``$LABKIT_GRADING_SECRET``, else labkit's own)."""
        if self.secret is not None:
            return self
        from labkit.instructor.grader.judging import grading_secret

        return dataclasses.replace(self, secret=grading_secret())

    def for_workers(self) -> GradingSettings:
        """What a worker is sent with each submission: no secret, no client credentials."""
        return dataclasses.replace(self, secret=None, security=None, worker_secret_file=None)

    def context(self) -> dict[str, Any]:
        """Everything besides the submission's bytes that decides its report (JSON-ready; needs the secret)."""
        import labkit
        from labkit.instructor.grader.results import code_identity, secret_identity

        if self.secret is None:
            raise ValueError("the context of a grading names its secret: resolve it first (with_secret)")
        return {"labkit": labkit.__version__, "code": code_identity(), "secret": secret_identity(self.secret),
                "cell_timeout_s": self.cell_timeout_s, "limits": dataclasses.asdict(self.limits),
                "isolate": self.isolate}
