"""The grading worker: runs inside the wall (:mod:`labkit.instructor.sandbox`), never trusted by the grader.

It executes the submitted notebook in a kernel, cell by cell (a time limit per cell; a kernel that ignores the
interrupt is killed and the run starts again without that cell; what cells print is kept up to a cap), then runs
one last cell that calls the learner's functions on the case inputs the grader wrote to ``cases.json``
(:func:`answer_cases`) and writes what each call returned, as plain data, to ``out/answers.json``. It writes
``out/status.json`` (cell errors, skipped cells) too. Neither file decides anything: the grader reads them as
untrusted data, compares the answers with labkit's reference itself, and gives the points.

    python -m labkit.instructor.worker --job DIR --cell-timeout 120 --answer-timeout 600 --output-bytes N

Layer 5 (instructor tools).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

MAX_KERNEL_DEATHS = 3
INTERRUPT_GRACE_S = 5  # after a time limit's interrupt, how long a kernel has to stop before it is killed
_ANSWER_CELL = ("from labkit.instructor.worker import answer_cases as _labkit_answer_cases\n"
                "_labkit_answer_cases(globals(), {cases!r}, {answers!r})")


# --------------------------------------------------------------------------------------------------------------
# Inside the learner's kernel: call the functions, write plain answers


def answer_cases(namespace: dict[str, Any], cases_path: str, answers_path: str) -> None:
    """Call each exercise's function from ``namespace`` on its cases; write what happened as plain data.

    An exercise stops at the first call that cannot be right whatever labkit's answer is (it raised, ran out of
    time, called labkit's reference): the grader's verdict stops there too.
    """
    import torch

    from labkit.exercises import get
    from labkit.exercises.calling import call_safely, plain
    from labkit.exercises.definitions import Case
    from labkit.instructor import wire

    plan = json.loads(Path(cases_path).read_text(encoding="utf-8"))
    answers: dict[str, Any] = {}
    for item in plan["exercises"]:
        try:
            exercise = get(item["id"])
        except ValueError:  # not an exercise this labkit knows: no answer, and the grader says so
            continue
        function = namespace.get(exercise.function)
        if function is None:
            answers[exercise.id] = {"missing": True}
            continue
        if not callable(function):
            answers[exercise.id] = {"not_callable": type(function).__name__}
            continue
        random.seed(item["seed"])  # a learner's function that draws random numbers draws the same each grading
        torch.manual_seed(item["seed"])
        outcomes = []
        for encoded in item["cases"]:
            args, kwargs = wire.from_plain(encoded, objects=True)
            outcome = call_safely(exercise, function, Case(tuple(args), dict(kwargs)))
            value = plain(outcome.value) if exercise.kind == "prediction" else outcome.value
            outcomes.append(_outcome_data(outcome, value))
            if outcome.error is not None or outcome.timed_out or outcome.called_forbidden:
                break
        answers[exercise.id] = {"outcomes": outcomes}
    Path(answers_path).write_text(json.dumps(answers), encoding="utf-8")


def _outcome_data(outcome: Any, value: Any) -> dict[str, Any]:
    from labkit.exercises.calling import FLOOD_CHARS, learner_frame
    from labkit.instructor import wire

    data: dict[str, Any] = {"printed": outcome.printed[: FLOOD_CHARS + 1], "timed_out": outcome.timed_out,
                            "forbidden": outcome.called_forbidden, "mutated": outcome.mutated}
    if outcome.error is not None:
        error = outcome.error
        frame = learner_frame(error.__traceback__)
        data["error"] = [type(error).__name__, (str(error).strip().splitlines() or [""])[0][:500]]
        data["where"] = f"in {frame.name}: {frame.line}" if frame is not None and frame.line else None
    else:
        data["value"] = wire.to_plain(value)
    return data


# --------------------------------------------------------------------------------------------------------------
# The notebook run


def _client_class():
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError
    from nbclient.util import ensure_async

    class CappedClient(NotebookClient):
        """nbclient with an output budget and a kernel that must stop when interrupted."""

        output_budget = 0
        output_dropped = 0
        ignored_interrupt_at: int | None = None
        current_cell: int | None = None

        def output(self, outs, msg, display_id, cell_index):
            size = len(json.dumps(msg.get("content", {}), default=str))
            if msg.get("msg_type") != "error":
                if size > self.output_budget:
                    self.output_dropped += size
                    return None
                self.output_budget -= size
            return super().output(outs, msg, display_id, cell_index)

        async def _async_handle_timeout(self, timeout, cell=None):
            from queue import Empty

            await ensure_async(self.km.interrupt_kernel())
            try:  # the interrupted cell's reply, if the kernel honours the interrupt
                await ensure_async(self.kc.shell_channel.get_msg(timeout=INTERRUPT_GRACE_S))
            except (Empty, asyncio.TimeoutError):
                self.ignored_interrupt_at = self.current_cell
                await ensure_async(self.km.shutdown_kernel(now=True))
                raise DeadKernelError("the kernel ignored the interrupt") from None
            return {"content": {**self.error_on_timeout, "status": "error"}}

    return CappedClient


def run_notebook(job: Path, cell_timeout_s: int, answer_timeout_s: int, output_bytes: int) -> dict[str, Any]:
    """Execute ``job/submission.ipynb`` and its answer cell; return the status (also written to out/status.json)."""
    import tempfile

    import nbformat
    from nbclient.exceptions import DeadKernelError
    from traitlets.config import Config

    skipped: dict[int, str] = {}
    client_class = _client_class()
    budget = output_bytes
    # Read once, before any of its code runs: a notebook that rewrites its own file changes nothing here.
    original = (job / "submission.ipynb").read_text(encoding="utf-8", errors="replace")
    for _ in range(MAX_KERNEL_DEATHS + 1):
        notebook = nbformat.reads(original, as_version=4)
        for index in skipped:
            notebook.cells[index].source = "# skipped by the grader: this cell stopped the kernel"
        notebook.cells.append(nbformat.v4.new_code_cell(_ANSWER_CELL.format(
            cases=str(job / "cases.json"), answers=str(job / "out" / "answers.json"))))
        last = len(notebook.cells) - 1
        errors: dict[int, str] = {}
        # IPC sockets in the private /tmp rather than TCP on the (empty) loopback: nothing listens on a port.
        config = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(tempfile.mkdtemp()) / "kernel")}})
        client = client_class(
            notebook, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True, config=config,
            timeout_func=lambda cell: answer_timeout_s if cell is notebook.cells[last] else cell_timeout_s,
            error_on_timeout={"ename": "CellTimeout", "evalue": "", "traceback": []},
            resources={"metadata": {"path": str(job)}},
        )
        client.output_budget = budget

        def started(cell, cell_index, client=client):
            client.current_cell = cell_index

        def executed(cell, cell_index, execute_reply, errors=errors):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    errors[cell_index] = f"{output.get('ename')}: {output.get('evalue')}"[:500]
            cell.outputs = []  # kept only as errors: a notebook's printing never piles up here

        def kernel_started(notebook, client=client):
            # jupyter-client 7+ keeps the process in a provisioner; 6.x (Colab's) on the manager as `kernel`.
            provisioner = getattr(client.km, "provisioner", None)
            client.kernel_process = getattr(provisioner, "process", None) or getattr(client.km, "kernel", None)

        client.on_cell_start = started
        client.on_cell_executed = executed
        client.on_notebook_start = kernel_started
        try:
            client.execute()
        except DeadKernelError:
            died = client.current_cell
            if died is None or died == last:
                break
            skipped[died] = ("the kernel ignored the interrupt at the time limit and was killed"
                             if client.ignored_interrupt_at == died else _death_reason(client))
            budget = client.output_budget
            continue
        break
    status = {"errors": {str(k): v for k, v in errors.items() if k != last},
              "answer_cell_error": errors.get(last), "skipped": {str(k): v for k, v in skipped.items()},
              "output_dropped_bytes": client.output_dropped}
    (job / "out" / "status.json").write_text(json.dumps(status), encoding="utf-8")
    return status


def _death_reason(client: Any) -> str:
    import signal

    process = getattr(client, "kernel_process", None)
    code = None if process is None else process.poll()
    if code is None:
        return "the kernel died in this cell"
    if code == -signal.SIGXCPU:
        return "the kernel died in this cell: it used up its CPU time limit"
    if code < 0:
        return f"the kernel died in this cell: killed by {signal.Signals(-code).name}"
    return f"the kernel died in this cell: it exited with code {code}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m labkit.instructor.worker")
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--cell-timeout", type=int, required=True)
    parser.add_argument("--answer-timeout", type=int, required=True)
    parser.add_argument("--output-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    (args.job / "out").mkdir(exist_ok=True)
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / "jupyter-runtime"))
    run_notebook(args.job, args.cell_timeout, args.answer_timeout, args.output_bytes)


if __name__ == "__main__":
    sys.exit(main())
