"""The grader outside the wall (trusted): settings, grading a submission, judging, reports, the review, the gradebook.

Layer 5 (instructor tools).
"""
