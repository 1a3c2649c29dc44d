"""labkit.core.validation: one rule (TypeError for a wrong type, ValueError out of range) and one message shape."""

import math
import re

import numpy as np
import pytest
import torch

from labkit.core import validation
from labkit.core.budget import workspace_bytes
from labkit.runtime.generation import generate
from labkit.core.loss import score_windows
from labkit.core.memory import kv_cache_bytes
from labkit.core.paging import request_stream
from labkit.core.sampling import apply_temperature, sampling_probs, top_k_filter
from labkit.core.spec import ModelSpec
from labkit.core.validation import boolean, choice, instance, integer, real, shown, tensor

SHAPE = re.compile(r"^(?P<name>\S+) must be (?P<accepted>.+), got (?P<value>.+)$")
TOY = ModelSpec("toy", n_layers=1, d_model=2, n_heads=1, n_kv_heads=1, head_dim=1, vocab=2)


# ----- each helper, by hand -----

def test_real_accepts_numbers_and_returns_a_float():
    assert real("x", 1) == 1.0 and isinstance(real("x", 1), float)
    assert real("x", np.float32(0.5), min=0, max=1) == 0.5
    assert real("x", None, optional=True) is None
    assert real("x", math.inf, finite=False) == math.inf


@pytest.mark.parametrize("value,kwargs,error,message", [
    ("1", dict(min=0, note="0 means greedy"), TypeError, "x must be a real number >= 0 (0 means greedy), got '1'"),
    (True, dict(), TypeError, "x must be a real number, got True"),
    (None, dict(min=0), TypeError, "x must be a real number >= 0, got None"),
    (-0.5, dict(min=0), ValueError, "x must be a real number >= 0, got -0.5"),
    (0, dict(min=0, min_open=True), ValueError, "x must be a real number > 0, got 0"),
    (1.0, dict(min=0, max=1, max_open=True), ValueError, "x must be a real number in [0, 1), got 1.0"),
    (2, dict(max=1), ValueError, "x must be a real number <= 1, got 2"),
    (math.nan, dict(), ValueError, "x must be a real number, got nan"),
    (math.inf, dict(min=0), ValueError, "x must be a real number >= 0, got inf"),
    ("a", dict(optional=True), TypeError, "x must be a real number or None, got 'a'"),
])
def test_real_rejects(value, kwargs, error, message):
    with pytest.raises(error) as raised:
        real("x", value, **kwargs)
    assert type(raised.value) is error and str(raised.value) == message


@pytest.mark.parametrize("value,kwargs,error,message", [
    (1.0, dict(min=0), TypeError, "n must be an int >= 0, got 1.0"),
    (True, dict(min=0), TypeError, "n must be an int >= 0, got True"),
    ("8", dict(), TypeError, "n must be an int, got '8'"),
    (-1, dict(min=0, note="0 switches it off"), ValueError, "n must be an int >= 0 (0 switches it off), got -1"),
    (5, dict(min=1, max=4), ValueError, "n must be an int in [1, 4], got 5"),
])
def test_integer_rejects(value, kwargs, error, message):
    with pytest.raises(error) as raised:
        integer("n", value, **kwargs)
    assert type(raised.value) is error and str(raised.value) == message


def test_integer_accepts_numpy_and_none_when_optional():
    assert integer("n", np.int64(3), min=0) == 3 and type(integer("n", np.int64(3))) is int
    assert integer("n", None, optional=True) is None


def test_choice_boolean_instance():
    assert choice("unit", "bits", ("nats", "bits")) == "bits"
    with pytest.raises(ValueError, match=r"^unit must be one of \['nats', 'bits'\], got 'bit'$"):
        choice("unit", "bit", ("nats", "bits"))
    with pytest.raises(TypeError, match=r"^unit must be one of \['nats', 'bits'\], got 2$"):
        choice("unit", 2, ("nats", "bits"))
    assert boolean("flag", False) is False
    with pytest.raises(TypeError, match="^flag must be a bool, got 1$"):
        boolean("flag", 1)
    with pytest.raises(TypeError, match=r"^spec must be a ModelSpec, got \{'n_layers': 2\}$"):
        instance("spec", {"n_layers": 2}, ModelSpec, "a ModelSpec")


def test_tensor_reads_only_metadata_and_says_what_it_got():
    ids = torch.tensor([[1, 2]])
    assert tensor("ids", ids, kind="int", ndim=2) is ids
    with pytest.raises(TypeError, match=r"^ids must be an integer tensor with 2 dimensions, got \[1, 2\]$"):
        tensor("ids", [1, 2], kind="int", ndim=2)
    with pytest.raises(TypeError, match="got a torch.bool tensor of shape"):
        tensor("ids", ids > 1, kind="int")
    with pytest.raises(ValueError, match=r"got a torch.int64 tensor of shape \(1, 0\)$"):
        tensor("ids", torch.zeros(1, 0, dtype=torch.long), kind="int", nonempty=True)
    assert tensor("x", torch.tensor([math.nan]), kind="float") is not None  # values are the caller's business


def test_a_long_value_is_cut_and_a_tensor_is_described():
    assert shown("a" * 500).endswith("...") and len(shown("a" * 500)) == 80
    assert shown(torch.zeros(3, 4, dtype=torch.float64)) == "a torch.float64 tensor of shape (3, 4)"


# ----- the same bad argument, the same error everywhere -----

def _raised(call):
    with pytest.raises((TypeError, ValueError)) as raised:
        call()
    return raised.value


def test_generate_and_sampling_reject_a_string_temperature_alike():
    from_generate = _raised(lambda: generate(None, torch.tensor([[1, 2]]), 3, temperature="1"))
    from_sampling = _raised(lambda: apply_temperature(torch.zeros(3), "1"))
    assert type(from_generate) is type(from_sampling) is TypeError
    assert str(from_generate) == str(from_sampling) == (
        "temperature must be a real number >= 0 (0 means greedy), got '1'")


@pytest.mark.parametrize("call,error,name,value", [
    (lambda: generate(None, torch.tensor([[1, 2]]), -1), ValueError, "max_new_tokens", "-1"),
    (lambda: generate(None, torch.tensor([[1, 2]]), 3, seed=1.5), TypeError, "seed", "1.5"),
    (lambda: generate(None, torch.tensor([[1.0, 2.0]]), 3), TypeError, "token_ids", "a torch.float32 tensor"),
    (lambda: sampling_probs(torch.zeros(3), top_p=0), ValueError, "top_p", "0"),
    (lambda: top_k_filter(torch.zeros(3), "2"), TypeError, "top_k", "'2'"),
    (lambda: kv_cache_bytes(TOY, 1.5, 8), TypeError, "batch_size", "1.5"),
    (lambda: kv_cache_bytes(TOY, 2, -8), ValueError, "seq_len", "-8"),
    (lambda: kv_cache_bytes(TOY, 2, 8, kv_dtype=8), TypeError, "kv_dtype", "8"),
    (lambda: workspace_bytes(10**9, "0.1"), TypeError, "fraction", "'0.1'"),
    (lambda: request_stream(3, seed=-1), ValueError, "seed", "-1"),
    (lambda: score_windows(10, window=2.5), TypeError, "window", "2.5"),
    (lambda: score_windows(10, window=4, stride=5), ValueError, "stride", "5"),
    (lambda: ModelSpec("x", n_layers=0, d_model=2, n_heads=1, n_kv_heads=1, head_dim=1, vocab=2), ValueError,
     "n_layers", "0"),
])
def test_every_module_uses_the_one_message_shape(call, error, name, value):
    raised = _raised(call)
    assert type(raised) is error
    parts = SHAPE.match(str(raised))
    assert parts, str(raised)
    assert parts["name"] == name and parts["value"].startswith(value)
