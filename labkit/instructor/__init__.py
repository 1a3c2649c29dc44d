"""Layer 5, instructor tools: building learner notebooks (``authoring``), grading submissions (``grading``,
with kernels under ``kernel_limits``) and the ``labkit`` command (``cli``)."""
