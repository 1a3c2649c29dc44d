"""The grading worker: runs inside the wall (:mod:`labkit.instructor.wall.sandbox`), never trusted by the grader.

It executes the submitted notebook in a kernel, cell by cell (a time limit per cell, a time budget for all of
them; a kernel that ignores the interrupt is killed and the run starts again without that cell; what cells print
is kept up to a cap). The kernel's first cell is the grader's own (:func:`labkit.instructor.wall.answering.install`,
before any learner code), its last the answering step. Between the worker and that step runs a socket only the
kernel was given, and a key sent over it before the first learner cell: the step signs "go", and only then does
the worker ask the grader (over a pipe the kernel never had) for the case inputs and pass them on; the answers
come back signed. Anything else the kernel says on that socket is not an answer. Before the step, every process
the notebook left running is killed. The worker itself cannot be read or traced by the kernel (it is not
dumpable), and it hands the grader one message: the cells' errors and the answers, or why there are none.

    python -I -m labkit.instructor.wall.worker --job DIR --lab 00 --to-grader FD --from-grader FD \
        --cell-timeout 120 --answer-timeout 600 --output-bytes N --budget-seconds 600

Layer 5 (instructor tools).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

MAX_KERNEL_DEATHS = 3
INTERRUPT_GRACE_S = 5  # after a time limit's interrupt, how long a kernel has to stop before it is killed


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


def _kill_others(keep: set[int]) -> None:
    """Kill every process of the wall's PID namespace but the worker, its ancestors and the kernel."""
    import signal

    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in keep and int(entry) != me:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def _ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found.add(pid)
    return found | {1}


def run_notebook(job: Path, lab: str, grader: tuple[int, int], cell_timeout_s: int, answer_timeout_s: int,
                 output_bytes: int, budget_s: int, isolated: bool) -> dict[str, Any]:
    """Execute ``job/submission.ipynb`` between the grader's first and last cells; the status and answers."""
    import socket
    import tempfile
    import time

    import nbformat
    from nbclient.exceptions import DeadKernelError
    from traitlets.config import Config

    from labkit.instructor.wall import answering, protocol

    skipped: dict[int, str] = {}
    client_class = _client_class()
    budget = output_bytes
    # Read once, before any of its code runs: a notebook that rewrites its own file changes nothing here.
    original = (job / "submission.ipynb").read_text(encoding="utf-8", errors="replace")
    step: protocol.WorkerRelay | None = None
    carried = 0.0  # the budget a cell that ignored its interrupt used: not given back on the next run
    for _ in range(MAX_KERNEL_DEATHS + 1):
        spent = {"seconds": carried, "started": None}  # per kernel: a crash costs at most one budget more
        if isolated:
            _kill_others(_ancestors())  # nothing a previous kernel left may touch the next one's start
        notebook = nbformat.reads(original, as_version=4)
        for index in skipped:
            notebook.cells[index].source = "# skipped by the grader: " + skipped[index]
        ours, kernels = socket.socketpair()
        step = protocol.WorkerRelay(ours.fileno(), protocol.hand_key(ours.fileno()), grader, answer_timeout_s)
        step.start()
        notebook.cells.insert(0, nbformat.v4.new_code_cell(answering.prologue(kernels.fileno(), lab)))
        notebook.cells.append(nbformat.v4.new_code_cell(answering.ANSWER_CELL))
        last = len(notebook.cells) - 1
        errors: dict[int, str] = {}
        # IPC sockets in the private /tmp rather than TCP on the (empty) loopback: nothing listens on a port.
        config = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(tempfile.mkdtemp()) / "kernel")}})
        # Fresh configuration folders for each kernel, made after every process the notebook left was killed: a
        # startup file, configuration or kernel spec a learner cell wrote never runs before the grader's cell.
        fresh = Path(tempfile.mkdtemp(prefix="kernel-"))
        os.environ.update(IPYTHONDIR=str(fresh / "ipython"), JUPYTER_CONFIG_DIR=str(fresh / "config"),
                          JUPYTER_DATA_DIR=str(fresh / "data"), JUPYTER_PATH="", PYTHONSAFEPATH="1",
                          PYTHONNOUSERSITE="1")
        client = client_class(
            notebook, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True, config=config,
            # The grader's own first and last cells get the answering time (the first imports torch and labkit).
            timeout_func=lambda cell: answer_timeout_s if cell is notebook.cells[0] or cell is notebook.cells[last]
            else cell_timeout_s,
            error_on_timeout={"ename": "CellTimeout", "evalue": "", "traceback": []},
            resources={"metadata": {"path": str(job)}}, extra_arguments=["--IPKernelApp.ignore_cwd=True"],
        )
        client.output_budget = budget

        def started(cell, cell_index, client=client, step=step, last=last, spent=spent):
            client.current_cell = cell_index
            now = time.monotonic()
            if spent["started"] is not None:
                spent["seconds"] += now - spent["started"]
            spent["started"] = now if 0 < cell_index < last else None
            if 0 < cell_index < last and spent["seconds"] > budget_s:
                skipped.setdefault(cell_index - 1, f"not run: the notebook's cells had used their time budget of "
                                                   f"{budget_s} s")
                cell.source = "pass"
            if cell_index == last:
                process = getattr(client, "kernel_process", None)
                if isolated and process is not None:
                    _kill_others(_ancestors() | {process.pid})
                step.arm()

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
        os.set_inheritable(kernels.fileno(), True)
        try:
            client.execute(pass_fds=(kernels.fileno(),), cwd=str(job))
        except DeadKernelError:
            died = client.current_cell
            if died is None or died in (0, last):
                break
            if client.ignored_interrupt_at == died:
                skipped[died - 1] = "the kernel ignored the interrupt at the time limit and was killed"
                carried = spent["seconds"] + time.monotonic() - (spent["started"] or time.monotonic())
            else:
                skipped[died - 1] = _death_reason(client)
            budget = client.output_budget
            continue
        finally:
            kernels.close()
        break
    step.wait(5)
    answers = step.payload
    prologue_error = errors.get(0)
    answer_error = step.error or errors.get(last) or (
        None if answers else "it never ran (a cell of the notebook stopped it, or the kernel died)")
    if prologue_error or (client.current_cell == 0 and not answers):
        answer_error = f"the grader's first cell failed: {prologue_error or 'the kernel died in it'}"
    status = {"errors": {str(k - 1): v for k, v in errors.items() if k not in (0, last)},
              "answer_cell_error": None if answers and "answers" in answers else (answer_error or "no answers"),
              "skipped": {str(k): v for k, v in skipped.items()}, "output_dropped_bytes": client.output_dropped}
    return {"status": status, "answers": answers}


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


def _not_dumpable() -> None:
    """Neither the kernel nor anything it starts (the same user) may trace this process or read its memory and
    file descriptors (``PR_SET_DUMPABLE`` 0). Hand-written with ctypes: Python has no ``prctl``."""
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)


def keep_out_iri_grammars() -> None:
    """Keep ``rfc3987_syntax`` from being imported in this process. jsonschema (under nbformat) imports it when it
    is installed (jupyter-events' format extras bring it), and it compiles 38 Lark grammars as it is imported:
    1.5 s of CPU for every submission, for checks of the "iri" formats that no notebook schema uses. Without it,
    jsonschema goes without those checks (its own ImportError path)."""
    if "rfc3987_syntax" not in sys.modules:
        sys.modules["rfc3987_syntax"] = None  # an import of it now raises ImportError


def main(argv: list[str] | None = None) -> None:
    keep_out_iri_grammars()
    parser = argparse.ArgumentParser(prog="python -m labkit.instructor.wall.worker")
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--lab", required=True)
    parser.add_argument("--to-grader", type=int, required=True)
    parser.add_argument("--from-grader", type=int, required=True)
    parser.add_argument("--cell-timeout", type=int, required=True)
    parser.add_argument("--answer-timeout", type=int, required=True)
    parser.add_argument("--output-bytes", type=int, required=True)
    parser.add_argument("--budget-seconds", type=int, default=600)
    parser.add_argument("--isolated", action="store_true")
    args = parser.parse_args(argv)
    _not_dumpable()
    for fd in (args.to_grader, args.from_grader):
        os.set_inheritable(fd, False)  # the kernel never gets the grader's pipes
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / "jupyter-runtime"))
    from labkit.instructor.wall import protocol

    try:
        result = run_notebook(args.job, args.lab, (args.from_grader, args.to_grader), args.cell_timeout,
                              args.answer_timeout, args.output_bytes, args.budget_seconds, args.isolated)
    except Exception as error:  # noqa: BLE001 - the grader reports it
        result = {"status": {"answer_cell_error": f"the worker failed: {type(error).__name__}: {error}"[:300]},
                  "answers": None}
    protocol.send_result(args.to_grader, result["status"], result["answers"])


if __name__ == "__main__":
    sys.exit(main())
