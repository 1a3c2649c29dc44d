"""The wall around a submission and what runs inside it (untrusted): the sandbox and its limits, the worker, the
answering step in the learner's kernel, the handshake, plain data across.

Layer 5 (instructor tools).
"""
