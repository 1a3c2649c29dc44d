"""labkit.exercises.random_cases: a seed draws the same random model shapes it drew before (lab 05 and lab 06 each
drew them with their own copy; a seed's verdict must not change)."""

import torch

from labkit.core.spec import ModelSpec
from labkit.exercises.random_cases import random_spec


def _two_specs_and_the_next_draw(**options):
    generator = torch.Generator().manual_seed(25)
    specs = [random_spec(generator, **options) for _ in range(2)]
    return specs, int(torch.randint(0, 1000, (1,), generator=generator))


def test_lab05s_shapes_are_the_ones_its_own_copy_drew():
    specs, after = _two_specs_and_the_next_draw(head_dims=(32, 64, 80, 96, 128, 256), max_layers=96,
                                                 uneven_width=True)
    assert specs == [ModelSpec("random", n_layers=30, d_model=320, n_heads=20, n_kv_heads=5, head_dim=32, vocab=32000),
                     ModelSpec("random", n_layers=83, d_model=1792, n_heads=56, n_kv_heads=7, head_dim=64, vocab=32000)]
    assert after == 157  # as many draws as before


def test_lab06s_shapes_are_the_ones_its_own_copy_drew():
    specs, after = _two_specs_and_the_next_draw(head_dims=(64, 80, 128), max_layers=80, with_params=True)
    assert specs == [ModelSpec("random", n_layers=16, d_model=1280, n_heads=20, n_kv_heads=5, head_dim=64, vocab=32000,
                               n_params=6761654459),
                     ModelSpec("random", n_layers=35, d_model=8192, n_heads=64, n_kv_heads=8, head_dim=128, vocab=32000,
                               n_params=9870078227)]
    assert after == 364


def test_every_shape_is_a_valid_grouped_query_model():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        spec = random_spec(generator, head_dims=(32, 64), max_layers=4, uneven_width=True)
        assert spec.n_heads % spec.n_kv_heads == 0 and spec.n_heads // spec.n_kv_heads in (1, 2, 4, 8)
        assert spec.d_model in (spec.n_heads * spec.head_dim, spec.n_heads * spec.head_dim // 2)
        assert 1 <= spec.n_layers <= 4 and spec.n_params is None
