"""The real answering step, in a process of its own but without a notebook server, a kernel manager or the wall.

A child Python runs an IPython shell as the grader's kernel does: the worker's first cell
(:func:`labkit.instructor.wall.answering.install`, the real audit hook), the learner's cells, then the worker's last
cell, which raises the answering event. This process plays the worker and the grader with the protocol's own ends
(:mod:`labkit.instructor.wall.protocol`): the worker's relay hands over the key, waits for the signed "go" and passes
the case inputs the grader drew (:func:`labkit.instructor.grader.judging.plan`) to the kernel; its signed answers
are judged by :func:`labkit.instructor.grader.judging.judge` as ``labkit grade`` does, and the review is the
static read plus what the hook refused. One child per submission: an audit hook cannot be removed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass, field
from typing import Any

import nbformat

from labkit.instructor.grader import judging, review
from labkit.instructor.grader.reports import ExerciseResult, Finding
from labkit.instructor.wall import answering, protocol

_CHILD = textwrap.dedent("""
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    cells = json.loads(sys.stdin.read())
    for source in cells:
        result = shell.run_cell(source)
""")


@dataclass
class Answered:
    """What the grader made of one submission answered through the real step."""

    results: dict[str, ExerciseResult]  # exercise id -> judge()'s result
    review: list[Finding]  # the review, as grading makes it: the static read and what the hook refused
    output: str = ""  # what the child printed (its cells' output), for a failing test's message
    problem: str | None = None
    refused: list[dict[str, Any]] = field(default_factory=list)

    def points(self, exercise_id: str) -> int:
        return self.results[exercise_id].points

    def details(self, exercise_id: str) -> str:
        return " ".join(self.results[exercise_id].details)


def answer(cells: list[str], lab: str = "00", seed: int = 3, timeout_s: float = 300) -> Answered:
    """Run ``cells`` as a learner's notebook between the worker's first and last cells; judge the answers."""
    chosen, worker_plan, drawn = judging.plan(lab, seed)
    ours, theirs = socket.socketpair()
    every = [answering.prologue(theirs.fileno(), lab), *cells, answering.ANSWER_CELL]
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        pass_fds=(theirs.fileno(),), env={**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}, text=True)
    theirs.close()
    # The worker's end of the real protocol, between the kernel's socket and a grader's end on two pipes.
    to_worker, to_grader = os.pipe(), os.pipe()
    relay = protocol.WorkerRelay(ours.fileno(), protocol.hand_key(ours.fileno()), (to_worker[0], to_grader[1]),
                                 timeout_s)
    relay.start()
    relay.arm()  # every cell runs at once here: the relay waits for the signed "go" from the start
    grader = protocol.GraderEnd({"exercises": worker_plan})
    talk = threading.Thread(target=grader.exchange, args=(to_grader[0], to_worker[1]), daemon=True)
    talk.start()
    try:
        child.stdin.write(json.dumps(every))
        child.stdin.close()
        relay.wait(timeout_s)
        protocol.send_result(to_grader[1], {"answer_cell_error": relay.error}, relay.payload)
        talk.join(timeout=60)
    finally:
        ours.close()
        try:
            output = child.stdout.read()
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            output = ""
        for descriptor in (*to_worker, *to_grader):
            os.close(descriptor)
    run = grader.result
    problem = run.problem or (None if run.answers is not None else f"the step failed: {run.step_error}")
    results = {exercise.id: judging.judge(exercise, drawn.get(exercise.id), run.answers, problem)
               for exercise in chosen}
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    findings = review.review_notebook(notebook, lab) + review.refusals(notebook, run.refused)
    return Answered(results, findings, output, problem, run.refused)
