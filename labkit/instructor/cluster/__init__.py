"""Grading a class on Dask distributed: the class run, its workers, batch-queue jobs.

Layer 5 (instructor tools).
"""
