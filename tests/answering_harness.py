"""The real answering step, in a process of its own but without a notebook server, a kernel manager or the wall.

A child Python runs an IPython shell as the grader's kernel does: the worker's first cell
(:func:`labkit.instructor.wall.answering.install`, the real audit hook), the learner's cells, then the worker's last cell,
which raises the answering event. This process plays the worker's side of the socket: it hands over the key,
waits for the signed "go", sends the case inputs the grader drew (:func:`labkit.instructor.grader.judging.plan`) and
reads the signed answers, which :func:`labkit.instructor.grader.judging.judge` scores as ``labkit grade`` does. What the
hook refused comes back as the review's findings. One child per submission: an audit hook cannot be removed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

import nbformat

from labkit.instructor.grader import judging, review

from labkit.instructor.wall import answering, wire

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

    results: dict[str, dict[str, Any]]  # exercise id -> judge()'s result
    review: list[dict[str, Any]]  # the hook's refusals as review findings
    output: str = ""  # what the child printed (its cells' output), for a failing test's message
    problem: str | None = None
    refused: list[dict[str, Any]] = field(default_factory=list)

    def points(self, exercise_id: str) -> int:
        return self.results[exercise_id]["points"]

    def details(self, exercise_id: str) -> str:
        return " ".join(self.results[exercise_id]["details"])


def answer(cells: list[str], lab: str = "00", seed: int = 3, timeout_s: float = 300) -> Answered:
    """Run ``cells`` as a learner's notebook between the worker's first and last cells; judge the answers."""
    chosen, worker_plan, drawn = judging.plan(lab, seed)
    ours, theirs = socket.socketpair()
    prologue = answering.prologue(theirs.fileno(), lab)
    every = [prologue, *cells, answering.ANSWER_CELL]
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        pass_fds=(theirs.fileno(),), env={**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}, text=True)
    theirs.close()
    problem, payload = None, {}
    try:
        child.stdin.write(json.dumps(every))
        child.stdin.close()
        key = os.urandom(answering.KEY_BYTES)
        fd = ours.fileno()
        wire.send_frame(fd, key)
        for _ in range(1000):  # a learner cell may write to the socket: only a signed "go" counts
            try:
                if wire.unsign(key, wire.read_frame(fd, 2**20, timeout_s)) == b"go":
                    break
            except wire.WireError as error:
                if "signed" not in str(error):
                    raise
        wire.send_frame(fd, json.dumps({"exercises": worker_plan}).encode())
        while True:
            try:
                payload = json.loads(wire.unsign(key, wire.read_frame(fd, 2**28, timeout_s)))
                break
            except wire.WireError as error:
                if "signed" not in str(error):
                    raise
    except wire.WireError as error:
        problem = f"no signed answers: {error}"
    finally:
        ours.close()
        try:
            output = child.stdout.read()
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            output = ""
    answers = payload.get("answers")
    if answers is None and problem is None:
        problem = f"the step failed: {payload.get('error')}"
    results = {exercise.id: judging.judge(exercise, drawn.get(exercise.id), answers, problem)
               for exercise in chosen}
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    refused = payload.get("refused") or []
    return Answered(results, review.refusals(notebook, refused), output, problem, refused)
