"""The course as data (layer 1, core): its labs, and the constants the lessons share.

The labs are ``data/course.json``'s list. The lessons' worked examples that several labs and tests use live here:
the four-token logits ``log 8, log 4, log 2, log 1`` and the chapter's 8B-like model. Also the environment report
of lab 00. How the course is rendered for Colab and README (its links, each notebook's Colab set-up cell) is
``labkit.instructor.authoring``.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata

from labkit.core.resources import load_json
from labkit.core.spec import ModelSpec

# The lesson's four-token vocabulary A, B, C, D: logits log 8, log 4, log 2, log 1, so softmax gives (8, 4, 2, 1)/15.
LESSON_WEIGHTS = (8.0, 4.0, 2.0, 1.0)

# Chapter 8's worked example: a Llama-3-8B-like model (32 layers, 32 query heads, 8 KV heads of width 128).
CHAPTER_8B = ModelSpec("8B-like (the chapter's example)", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
                       head_dim=128, vocab=128256)


def lesson_logits(dtype=None):
    """The lesson's logits ``log 8, log 4, log 2, log 1`` as a tensor (float32 unless ``dtype`` says otherwise).

    >>> [round(p, 4) for p in lesson_logits().softmax(-1).tolist()]
    [0.5333, 0.2667, 0.1333, 0.0667]
    """
    import torch

    return torch.tensor(LESSON_WEIGHTS, dtype=dtype or torch.float32).log()


@dataclass(frozen=True)
class Lab:
    notebook: str  # file name under notebooks/
    title: str
    planned: bool = False  # announced in the tour, not written yet


def labs() -> list[Lab]:
    """Every lab of the course in order.

    >>> labs()[0].notebook
    '00_start_here.ipynb'
    """
    return [Lab(**entry) for entry in load_json("course.json")["labs"]]


def environment_report() -> dict[str, str]:
    """Versions and hardware facts worth stating before any measurement."""
    import torch

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "ipywidgets": version("ipywidgets"),
        "labkit": version("labkit"),
        "cpu cores (os)": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "cuda available": str(torch.cuda.is_available()),
        "in colab": str("google.colab" in sys.modules),
    }
