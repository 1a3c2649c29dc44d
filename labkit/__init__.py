"""labkit: the library behind the workbook on the mathematics of running a language model.

Core modules are pure math (``spec``, and one module per lab topic); ``models`` loads the embedded model;
explorers and exercises sit on top. Import what a lab needs from its module, e.g.
``from labkit.models import load_model``.
"""

__version__ = "0.1.0"
