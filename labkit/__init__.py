"""labkit: the library behind the workbook on the mathematics of running a language model.

The layers of docs/DESIGN.md are folders, and imports point down only (a test reads them):

1. ``labkit.core`` -- pure math, one module per lab topic (sampling, loss, memory, ...);
2. ``labkit.runtime`` -- loading models and the only code that runs them (forward passes, caches, capture,
   generation, scoring a text);
3. ``labkit.explorers`` -- one interactive widget per lab;
4. ``labkit.exercises`` -- graded exercises, the checker and the learner's progress;
5. ``labkit.instructor`` -- building learner notebooks, grading, the ``labkit`` command.

Import what a lab needs from its module, e.g. ``from labkit.runtime.models import load_model``.
"""

__version__ = "0.3.2"
