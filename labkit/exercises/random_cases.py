"""Random cases that several labs' exercises draw: a random model shape.

Each draw takes the exercise's ``torch.Generator``, so a seed replays the same cases (the seed a failing check
prints).

Layer 4 (exercises): imports the core, never widgets.
"""

from __future__ import annotations

import torch

from labkit.core.spec import ModelSpec


def random_spec(generator: torch.Generator, *, head_dims: tuple[int, ...], max_layers: int,
                uneven_width: bool = False, with_params: bool = False) -> ModelSpec:
    """A random model shape: 1 to 8 KV heads, each shared by 1, 2, 4 or 8 query heads, a head_dim from
    ``head_dims``, 1 to ``max_layers`` layers and a vocabulary of 32,000.

    ``d_model`` is n_heads x head_dim, except that with ``uneven_width`` a third of the specs halve it (models
    whose d_model is not n_heads x head_dim exist); ``with_params`` also draws ``n_params`` (10^7 to 10^11).
    The draws come in a fixed order, so the same generator state gives the same spec.

    >>> spec = random_spec(torch.Generator().manual_seed(0), head_dims=(64, 128), max_layers=32)
    >>> spec.n_heads % spec.n_kv_heads, spec.d_model == spec.n_heads * spec.head_dim, spec.n_params
    (0, True, None)
    """
    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    n_kv_heads, group = draw(1, 8), [1, 2, 4, 8][draw(0, 3)]
    n_heads = n_kv_heads * group
    head_dim = head_dims[draw(0, len(head_dims) - 1)]
    d_model = n_heads * head_dim
    if uneven_width:
        d_model //= [1, 1, 2][draw(0, 2)]
    n_layers = draw(1, max_layers)
    n_params = draw(10**7, 10**11) if with_params else None
    return ModelSpec("random", n_layers=n_layers, d_model=max(d_model, 1), n_heads=n_heads, n_kv_heads=n_kv_heads,
                     head_dim=head_dim, vocab=32000, n_params=n_params)
