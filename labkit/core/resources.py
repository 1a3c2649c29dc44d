"""Where labkit finds its data files and keeps its caches.

Data ships inside the package (``labkit.data``), so an installed wheel reads the same files as a checkout.
Caches live under ``$LABKIT_CACHE`` when set, else the user's cache directory.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import platformdirs

GB = 10**9  # decimal gigabyte, as disk and GPU vendors count
GIB = 2**30  # binary gibibyte, as operating systems and allocators count
MIB = 2**20  # binary mebibyte, for small tensors


def data_path(name: str) -> Path:
    """Path of a file shipped in ``labkit.data``.

    >>> data_path("models.json").name
    'models.json'
    """
    path = Path(str(resources.files("labkit.data").joinpath(name)))
    if not path.is_file():
        known = sorted(p.name for p in Path(str(resources.files("labkit.data"))).iterdir() if p.is_file())
        raise FileNotFoundError(f"labkit has no data file {name!r}; it ships {known}")
    return path


def load_json(name: str) -> Any:
    """Parsed contents of a JSON file shipped in ``labkit.data``."""
    return json.loads(data_path(name).read_text(encoding="utf-8"))


def cache_root() -> Path:
    """Directory for labkit's caches: ``$LABKIT_CACHE`` if set, else the user cache dir."""
    configured = os.environ.get("LABKIT_CACHE")
    return Path(configured).expanduser() if configured else Path(platformdirs.user_cache_dir("labkit"))
