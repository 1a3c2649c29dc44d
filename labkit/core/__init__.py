"""Layer 1, the core: pure functions and small frozen dataclasses over torch and numpy, one module per topic.

No widgets, no plots, no model calls. ``sampling`` (logits to a distribution), ``loss`` (surprisal, cross-entropy,
perplexity, the window rule), ``memory``, ``budget`` and ``paging`` (bytes of weights, KV cache, a request,
paged allocation), ``spec`` (model and GPU specifications, GB and GiB), ``presets`` (real models and GPUs, with
sources), ``texts`` (the evaluation text), ``course`` (the labs and the course's constants), ``validation`` (one
error shape for bad arguments) and ``resources`` (where data and caches live).
"""
