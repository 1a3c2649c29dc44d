"""Layer 5, instructor tools, split by trust boundary: building learner notebooks (``authoring``); the grader
outside the wall, trusted (``grader``); the wall and what runs inside it (``wall``); a class on Dask
(``cluster``); the ``labkit`` command (``cli``)."""
