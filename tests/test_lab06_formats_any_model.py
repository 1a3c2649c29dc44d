"""Lab 06's weight-format section runs on a model that is not a Llama (issue #49): its cells, read from the solution
notebook as a learner runs them, with ``lm`` a small GPT-2 (transformers' ``Conv1D`` projections, learned position
embeddings) loaded from a folder as a learner's own model would be.

The cells are the notebook's own (found by what they define, not by their index): the set-up, the bandwidth probe,
the three formats' decoders and TPOTs, their comparison and the profiled step. Their numbers are timings, so only
what is not a timing is asserted: each format's bytes a step reads, and that every line the cells print is there.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import nbformat
import pytest

from any_models import build_small

ROOT = Path(__file__).resolve().parent.parent


def _cell(notebook, marker: str) -> str:
    [source] = [cell.source for cell in notebook.cells if cell.cell_type == "code" and marker in cell.source]
    return source


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory, embedded):
    folder = tmp_path_factory.mktemp("gpt2")
    build_small("gpt2", len(embedded.tokenizer), seed=0).save_pretrained(folder, safe_serialization=True)
    embedded.tokenizer.save_pretrained(folder)
    return folder


def test_lab_06s_format_cells_run_on_a_gpt2(gpt2_folder):
    from labkit.runtime.models import load_model

    notebook = nbformat.read(ROOT / "notebooks" / "solutions" / "06_prefill_decode.ipynb", as_version=4)
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(_cell(notebook, "from labkit.runtime import timing as measure"), namespace)  # the set-up cell
        lm = load_model(str(gpt2_folder))  # the learner's own model, in the set-up cell's place
        namespace.update(lm=lm, spec=lm.spec, ids=lm.text_ids(namespace["PROMPT"]))
        for marker in ("roof = probes.roofline_probe", 'FORMATS = ("fp32"', "for fast, slow in",
                       "profile_decode(formats[name]"):
            exec(_cell(notebook, marker), namespace)
    assert type(lm.model).__name__ == "GPT2LMHeadModel" and lm.forward_name == "transformers"
    bytes_read = namespace["bytes_read"]
    assert bytes_read["bf16"] * 1.99 < bytes_read["fp32"] and bytes_read["int8"] * 3.2 < bytes_read["fp32"]
    text = printed.getvalue()
    for name in ("fp32", "bf16", "int8"):
        assert f"{name}: {bytes_read[name]:>11,} B a step" in text and f"one {name} step, profiled" in text
    assert text.count("speedup") == 4, text
