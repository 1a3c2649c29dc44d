"""The real answering step, in a process of its own but without a notebook server, a kernel manager or the wall.

A child Python runs an IPython shell as the grader's kernel does: the worker's first cell
(:func:`labkit.instructor.wall.answering.install`, the real audit hook), the learner's cells, then the worker's last
cell, which raises the answering event. This process plays the worker and the grader with the protocol's own ends
(:mod:`labkit.instructor.wall.protocol`): the worker's relay hands over the key, waits for the signed "go" and passes
the case inputs the grader drew (:func:`labkit.instructor.grader.judging.plan`) to the kernel; its signed answers
are judged by :func:`labkit.instructor.grader.judging.judge` as ``labkit grade`` does, and the review is the
static read plus what the hook refused. One child per submission: an audit hook cannot be removed.

The children are forked from one warmed interpreter per test process (:class:`_Zygote`), which has imported what a
kernel has imported by the time the worker's first cell has run (IPython, torch, labkit's exercises and the
answering step) and nothing more: each child is as fresh as a new process where it matters (no hook, no thread
besides its own, nothing of a learner's) without paying 2 s of CPU to import torch again (the 35 answering tests: 94 s of CPU
before, 57 s after, measured).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import nbformat

from labkit.instructor.grader import judging, review
from labkit.instructor.grader.reports import ExerciseResult, Finding
from labkit.instructor.wall import answering, protocol

# The zygote: imports once, then for each request (the child's stdin, its stdout and the kernel's end of the socket,
# passed over the control socket with the number the worker's first cell names) forks a child that runs the cells in
# an IPython shell, as the grader's kernel does, and answers with the child's pid. Children are reaped by the kernel.
_ZYGOTE = textwrap.dedent("""
    import json, os, signal, socket, sys
    from IPython.core.interactiveshell import InteractiveShell
    import torch
    import labkit.exercises
    import labkit.instructor.wall.answering
    control = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    control.sendall(b"ready")
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1024, 3)
        if not message:
            break
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            stdin, stdout, kernel_end = fds
            os.dup2(stdin, 0)
            os.dup2(stdout, 1)
            os.dup2(stdout, 2)
            os.dup2(kernel_end, int(message))
            for fd in {stdin, stdout, kernel_end} - {0, 1, 2, int(message)}:
                os.close(fd)
            shell = InteractiveShell.instance()
            for source in json.loads(sys.stdin.read()):
                shell.run_cell(source)
            sys.exit(0)
        for fd in fds:
            os.close(fd)
        control.sendall(str(pid).encode())
""")


class _Zygote:
    """The warmed interpreter children are forked from: one per test process, started on first use (and again
    should it have ended: a child it forked could kill its parent)."""

    _process: subprocess.Popen | None = None
    _control: socket.socket | None = None

    @classmethod
    def fork(cls, kernel_end: int) -> "_Child":
        if cls._process is None or cls._process.poll() is not None:
            cls._start()
        stdin, stdout = os.pipe(), os.pipe()
        socket.send_fds(cls._control, [str(kernel_end).encode()], [stdin[0], stdout[1], kernel_end])
        os.close(stdin[0])
        os.close(stdout[1])
        return _Child(int(cls._control.recv(32)), os.fdopen(stdin[1], "w"), os.fdopen(stdout[0]))

    @classmethod
    def _start(cls) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
        cls._process = subprocess.Popen([sys.executable, "-c", _ZYGOTE, str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        if ours.recv(16) != b"ready":
            raise RuntimeError("the answering harness's zygote did not start (its error is above)")
        cls._control = ours


@dataclass
class _Child:
    """A forked child: its pid, the writing end of its stdin and the reading end of its output."""

    pid: int
    stdin: Any
    stdout: Any

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"child {self.pid}", timeout)
            time.sleep(0.05)

    def alive(self) -> bool:
        try:  # the zygote reaps its children: a pid that is gone has ended
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


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
    child = _Zygote.fork(theirs.fileno())
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
