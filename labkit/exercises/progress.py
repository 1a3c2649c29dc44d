"""Exercise progress that survives a kernel restart: a small JSON file, written atomically.

The file is ``$LABKIT_PROGRESS`` when set, else ``progress.json`` in the user's data directory. A write goes to
a temporary file in the same directory and is renamed over the old one, so a crash mid-write leaves the previous
copy. A file that cannot be read is set aside (renamed ``*.corrupt``) with a message, and progress starts afresh;
it never stops a check from running.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import platformdirs


def progress_path() -> Path:
    configured = os.environ.get("LABKIT_PROGRESS")
    return Path(configured).expanduser() if configured else Path(platformdirs.user_data_dir("labkit")) / "progress.json"


def load(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every recorded exercise, by id: ``{"status", "points", "max_points", "attempts", "best", "updated"}``,
    and ``"close"`` for a prediction (how close its last answer came; not scored)."""
    path = path or progress_path()
    if not path.exists():
        return {}
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(records, dict) or not all(isinstance(v, dict) for v in records.values()):
            raise ValueError("not a mapping of exercise records")
        return records
    except (OSError, ValueError) as error:
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        try:
            os.replace(path, aside)
            where = f"set aside as {aside.name}"
        except OSError:
            where = "left in place"
        print(f"labkit: the progress file {path} could not be read ({error}); it was {where} and progress starts afresh.")
        return {}


def _write(records: dict[str, dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(records, stream, indent=1, sort_keys=True)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


_RANK = {"not attempted": 0, "failed": 1, "passed": 2}


def record(exercise_id: str, status: str, points: int, max_points: int, path: Path | None = None,
           close: bool | None = None) -> None:
    """Store the latest verdict of an exercise (and keep the best one seen); ``close``: a prediction's accuracy."""
    if status not in _RANK:
        raise ValueError(f"status must be one of {sorted(_RANK)}, got {status!r}")
    path = path or progress_path()
    records = load(path)
    previous = records.get(exercise_id, {})
    best = previous.get("best", "not attempted")
    records[exercise_id] = {
        "status": status,
        "points": points,
        "max_points": max_points,
        "attempts": previous.get("attempts", 0) + (status != "not attempted"),
        "best": status if _RANK[status] > _RANK[best] else best,
        "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if close is not None:
        records[exercise_id]["close"] = close
    try:
        _write(records, path)
    except OSError as error:  # a read-only home must not break the lab
        print(f"labkit: could not save progress to {path} ({error})")
