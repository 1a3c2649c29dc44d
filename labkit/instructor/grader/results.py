"""The durable result store of a class: each finished report kept at once, so an interrupted run resumes.

A report is stored under a key made of the submission's bytes and its grading context
(:meth:`labkit.instructor.grader.settings.GradingSettings.context`:
labkit's version and a hash of its code, the secret's identity, the cell time limit, the limits, the wall), in
``OUT/results/<key>.json``, written whole or not at all (:func:`write_atomically`). Running the same command again
grades only the submissions whose key is missing, and the gradebook made from the stored reports is byte for byte
the same. The secret itself is never stored: only :func:`secret_identity`, a one-way hash of it. A submission
handed in twice byte for byte has one key, so it is graded once.

Only the client (the process that owns the output folder) writes here; workers return reports to it.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from labkit.instructor.grader.reports import SubmissionReport

STORE = "results"


def write_atomically(path: Path, text: str | bytes) -> None:
    """``path`` holds ``text`` whole, or keeps what it held: written to a file beside it, then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name[:200]}.{os.getpid()}.partial")
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        with open(aside, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(aside, path)
    finally:
        if aside.exists():
            aside.unlink()


def secret_identity(secret: bytes) -> str:
    """A name for the secret that does not reveal it: two runs with the same secret share their results.

    >>> secret_identity(b"k") == secret_identity(b"k") != secret_identity(b"other")
    True
    """
    return hashlib.sha256(b"labkit grading secret identity\0" + secret).hexdigest()[:16]


def code_identity() -> str:
    """A hash of labkit's Python code: a grader whose code differs is another grader (its data files are left out:
    a test may rewrite one for a moment, and the version check covers releases)."""
    import labkit

    root = Path(labkit.__file__).parent
    hasher = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" not in path.parts and path.is_file():
            hasher.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return hasher.hexdigest()[:16]


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def result_key(content: str, context: dict[str, Any]) -> str:
    """The store's key of a submission (its content hash) graded in ``context``."""
    text = json.dumps({"content": content, "context": context}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


class ResultStore:
    """Reports kept one file per key under ``folder``; :meth:`put` writes one whole at once."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def path(self, key: str) -> Path:
        if len(key) != 40 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"key must be 40 hexadecimal digits, got {key!r}")
        return self.folder / f"{key}.json"

    def get(self, key: str) -> SubmissionReport | None:
        """The stored report, or None when there is none (or it cannot be read: it is graded again)."""
        try:
            data = json.loads(self.path(key).read_text(encoding="utf-8"))
            return SubmissionReport.from_json(data) if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def put(self, key: str, report: SubmissionReport) -> None:
        write_atomically(self.path(key), json.dumps(report.to_json(), indent=2, sort_keys=True))

    def keys(self) -> set[str]:
        return {path.stem for path in self.folder.glob("*.json")} if self.folder.is_dir() else set()
