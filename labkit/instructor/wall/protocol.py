"""The answering step's handshake, all three ends in one place: the grader (outside the wall), the worker (inside,
untrusted but not the learner's) and the learner's kernel (where the answering step runs).

Every message is one frame (:func:`send_frame`: a length, then the bytes)::

    worker -> kernel   the key                        once, before any learner cell (:func:`hand_key`, :func:`take_key`)
    kernel -> worker   signed "go"                    the step started: nothing the notebook ran saw the cases
    worker -> grader   {"ready": true}
    grader -> worker   {"exercises": [...]}           the case inputs, relayed to the kernel as they are
    kernel -> worker   signed {"answers"|"error", "refused"}
    worker -> grader   {"result": {"status": ..., "answers": <that payload>}}   the worker's one report

Only what the key signs counts as the kernel's: a learner cell may write anything to the socket, and every frame
not signed is skipped. The kernel signs with :func:`labkit.instructor.wall.answering.install`'s signer, which
holds the key out of the learner's reach. The grader reads the worker's report as :class:`WorkerReport`.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from labkit.instructor.wall.wire import WireError

KEY_BYTES = 32
GO = b"go"
MAX_CASES_BYTES = 256 * 2**20  # the case inputs of one lab
MAX_MESSAGE_BYTES = 256 * 2**20  # a signed payload of answers
MAX_RESULT_BYTES = 64 * 2**20  # the worker's report to the grader
MAX_SKIPPED_FRAMES = 1000  # what a learner cell may leave on the socket before the step's own frame


# --------------------------------------------------------------------------------------------------------------
# Frames over a pipe or socket, and signed payloads

_LENGTH = 8  # bytes of the big-endian length before each frame
SIGNATURE = hashlib.sha256().digest_size


def send_frame(fd: int, payload: bytes) -> None:
    """Write one frame to the file descriptor ``fd``: its length (8 bytes, big-endian), then ``payload``."""
    channel(fd)[0](payload)


def read_frame(fd: int, cap: int, timeout_s: float | None = None) -> bytes:
    """One frame from ``fd``: never more than ``cap`` bytes kept, never longer than ``timeout_s`` waited (None:
    no limit). Raises :class:`WireError` at the end of the stream, on a frame over the cap, or when the time is up.
    """
    return channel(fd)[1](cap, timeout_s)


def sign(key: bytes, payload: bytes) -> bytes:
    """``payload`` signed with ``key`` (HMAC-SHA256 before it): only a holder of the key makes one."""
    return hmac.new(key, payload, hashlib.sha256).digest() + payload


def unsign(key: bytes, signed: bytes) -> bytes:
    """The payload of :func:`sign`'s output; :class:`WireError` when it was not signed with ``key``.

    >>> unsign(b"k", sign(b"k", b"answers"))
    b'answers'
    """
    mac, payload = signed[:SIGNATURE], signed[SIGNATURE:]
    if len(mac) != SIGNATURE or not hmac.compare_digest(mac, hmac.new(key, payload, hashlib.sha256).digest()):
        raise WireError("a message not signed by the grader's answering step")
    return payload


# --------------------------------------------------------------------------------------------------------------
# The key


def hand_key(fd: int) -> bytes:
    """The worker's end: a fresh key, sent to the kernel on ``fd``; returned to check what the kernel signs."""
    key = os.urandom(KEY_BYTES)
    send_frame(fd, key)
    return key


def take_key(fd: int) -> bytes:
    """The kernel's end: the key the worker sent (before any learner cell ran)."""
    return read_frame(fd, KEY_BYTES, timeout_s=60)


def read_signed(fd: int, key: bytes, cap: int, timeout_s: float) -> bytes:
    """The payload of the next frame on ``fd`` signed with ``key``; unsigned frames are skipped."""
    for _ in range(MAX_SKIPPED_FRAMES):
        try:
            return unsign(key, read_frame(fd, cap, timeout_s))
        except WireError as error:
            if "signed" not in str(error):
                raise
    raise WireError("no signed message among the frames on the kernel's socket")


# --------------------------------------------------------------------------------------------------------------
# The kernel's end


def channel(fd: int) -> tuple[Callable[[bytes], None], Callable[[int, float | None], bytes]]:
    """(send a frame, receive one within a cap and a time) on ``fd``: closures over C functions bound now
    (``os.read``, ``os.write``, ``select.select`` and the built-ins they need), so that what a learner cell rebinds
    later (any module's function, a class's method, a built-in) is not on their path. Every end frames this way."""
    read, write, wait, monotonic, blocking = os.read, os.write, select.select, time.monotonic, os.set_blocking
    size, most, least, view_of, join_bytes = len, max, min, memoryview, b"".join
    error, from_bytes = WireError, int.from_bytes

    def send(payload: bytes) -> None:
        blocking(fd, True)  # however a learner cell left it
        view = view_of(size(payload).to_bytes(_LENGTH, "big") + payload)
        while view:
            view = view[write(fd, view):]

    def exactly(count: int, deadline: float | None) -> bytes:
        chunks, left = [], count
        while left:
            if not wait([fd], [], [], None if deadline is None else most(0.0, deadline - monotonic()))[0]:
                raise error("no message in time")
            chunk = read(fd, least(left, 1 << 20))
            if not chunk:
                raise error("the stream ended")
            chunks.append(chunk)
            left -= size(chunk)
        return join_bytes(chunks)

    def receive(cap: int, timeout_s: float | None) -> bytes:
        deadline = None if timeout_s is None else monotonic() + timeout_s
        length = from_bytes(exactly(_LENGTH, deadline), "big")
        if length > cap:
            raise error(f"a message of {length} bytes, more than the {cap} allowed")
        return exactly(length, deadline)

    return send, receive


def json_codec() -> tuple[Callable[[Any], str], Callable[[str], Any]]:
    """(plain data as JSON text, JSON text as plain data): ``_json``'s C encoder and scanner bound now, so a cell
    that replaces ``json.dumps`` or ``json.loads`` later is not on their path. The text is ``json.dumps``'s own,
    byte for byte, for the plain data the wire carries."""
    import _json
    from types import SimpleNamespace

    size, join_text, error = len, "".join, WireError
    # json.dumps's defaults: no indent, ASCII, keys unsorted, NaN allowed (markers None: the data is a tree)
    encoder = _json.make_encoder(None, _not_plain, _json.encode_basestring_ascii, None, ": ", ", ", False, False,
                                 True)
    scanner = _json.make_scanner(SimpleNamespace(strict=True, object_hook=None, object_pairs_hook=None,
                                                 parse_float=float, parse_int=int, parse_constant=float, memo={}))

    def encode(value: Any) -> str:
        return join_text(encoder(value, 0))

    def decode(text: str) -> Any:
        value, end = scanner(text, 0)
        if end != size(text):
            raise error("not one JSON value")
        return value

    return encode, decode


def kernel_end(fd: int) -> tuple:
    """The kernel's end of the socket ``fd``, made before any learner cell: (send, receive) of :func:`channel` and
    (encode, decode) of :func:`json_codec`. The step carries the cases in and the answers out through these alone
    (a cell that replaced ``json.dumps`` once rewrote the answers before they were signed, and one that replaced
    ``json.loads`` saw every exercise's cases before the first was answered)."""
    return (*channel(fd), *json_codec())


def _not_plain(value: Any) -> None:
    raise TypeError(f"not plain data: {type(value).__name__}")


def kernel_step(end: tuple, sign: Callable[[bytes], bytes], prepare: Callable[[], None],
                answer: Callable[[dict[str, Any]], dict[str, str]], refused: Callable[[], list[dict[str, Any]]]) -> None:
    """The answering step's messages over ``end`` (:func:`kernel_end`): ``prepare()``, signed "go", the cases, then
    ``answer(cases)`` (each exercise's answers as JSON text) signed with what was ``refused()``. Whatever stops the
    step is its error (every exercise then fails with it).

    ``sign`` signs for its caller's frame only when that frame runs the step's own code, so it is called here
    through the step's frame: see :func:`labkit.instructor.wall.answering.install`."""
    send, receive, encode, decode = end
    try:
        prepare()
        send(sign(GO))
        answers = answer(decode(receive(MAX_CASES_BYTES, 600).decode()))
        text = '{"answers": {' + ", ".join([encode(key) + ": " + value for key, value in answers.items()]) + "}"
    except BaseException as error:  # noqa: BLE001 - whatever stopped the step is its error, shown per exercise
        text = '{"error": ' + encode(f"{type(error).__name__}: {str(error)[:300]}")
    send(sign((text + ', "refused": ' + encode(refused()) + "}").encode()))


# --------------------------------------------------------------------------------------------------------------
# The worker's end


class WorkerRelay:
    """The worker's side of the step, on a thread started before any learner cell (a notebook that used up its
    process limit must not keep the grader from answering) and armed by the worker's last cell: signed "go" ->
    ready to the grader -> the grader's cases to the kernel -> the kernel's signed payload."""

    def __init__(self, kernel_fd: int, key: bytes, grader: tuple[int, int], timeout_s: float) -> None:
        self.kernel_fd, self.key, self.grader, self.timeout_s = kernel_fd, key, grader, timeout_s
        self.payload: dict[str, Any] | None = None
        self.error: str | None = None
        self.thread: threading.Thread | None = None
        self.armed = threading.Event()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def arm(self) -> None:
        self.armed.set()

    def _run(self) -> None:
        self.armed.wait()
        try:
            if read_signed(self.kernel_fd, self.key, 2**20, self.timeout_s) != GO:
                raise WireError("the grader's step never started")
            from_grader, to_grader = self.grader
            send_frame(to_grader, json.dumps({"ready": True}).encode())
            send_frame(self.kernel_fd, read_frame(from_grader, MAX_CASES_BYTES, self.timeout_s))
            payload = json.loads(read_signed(self.kernel_fd, self.key, MAX_MESSAGE_BYTES, self.timeout_s))
            self.payload = payload if isinstance(payload, dict) else None
        except Exception as error:  # noqa: BLE001 - reported as the step's error
            self.error = f"{type(error).__name__}: {error}"[:300]

    def wait(self, timeout_s: float) -> None:
        if self.thread is not None and self.armed.is_set():  # never armed: it has nothing to finish
            self.thread.join(timeout=timeout_s)


def send_result(to_grader: int, status: dict[str, Any], payload: dict[str, Any] | None) -> None:
    """The worker's one report: the notebook run's status and the kernel's payload (None: no answers)."""
    send_frame(to_grader, json.dumps({"result": {"status": status, "answers": payload}}).encode())


# --------------------------------------------------------------------------------------------------------------
# The grader's end


@dataclass
class WorkerReport:
    """What the worker reported, read defensively: the worker is inside the wall, so nothing here is trusted to be
    well-formed (anything malformed reads as absent)."""

    answers: dict[str, Any] | None = None  # exercise id -> the kernel's plain answer
    refused: list[Any] = field(default_factory=list)  # what the hook refused, for the review
    step_error: str | None = None  # why the answering step gave no answers
    cell_errors: dict[str, Any] = field(default_factory=dict)  # cell index -> its error
    skipped: dict[str, Any] = field(default_factory=dict)  # cell index -> why it was not run
    output_dropped_bytes: int = 0
    problem: str | None = None  # the worker's message could not be read

    @classmethod
    def of(cls, message: Any, problem: str | None = None) -> WorkerReport:
        result = message.get("result") if isinstance(message, dict) else None
        result = result if isinstance(result, dict) else {}
        status = result.get("status") if isinstance(result.get("status"), dict) else {}
        step = result.get("answers") if isinstance(result.get("answers"), dict) else {}
        answers = step.get("answers") if isinstance(step.get("answers"), dict) else None
        error = step.get("error") or status.get("answer_cell_error")
        dropped = status.get("output_dropped_bytes")
        return cls(answers=answers, refused=step.get("refused") if isinstance(step.get("refused"), list) else [],
                   step_error=str(error)[:300] if error else None,
                   cell_errors=status.get("errors") if isinstance(status.get("errors"), dict) else {},
                   skipped=status.get("skipped") if isinstance(status.get("skipped"), dict) else {},
                   output_dropped_bytes=dropped if type(dropped) is int else 0, problem=problem)


class GraderEnd:
    """The grader's end of the worker's pipes: the cases only when the step is ready, then the worker's report.
    ``exchange`` runs on the sandbox's exchange thread; :attr:`result` is what came back."""

    def __init__(self, cases: dict[str, Any]) -> None:
        self.cases = json.dumps(cases).encode()
        self.sent = False
        self.message: Any = None
        self.problem: str | None = None

    def exchange(self, read_fd: int, write_fd: int) -> None:
        while True:
            try:
                message = json.loads(read_frame(read_fd, MAX_RESULT_BYTES))
            except (WireError, ValueError, RecursionError) as error:
                self.problem = self.problem or f"its worker's message could not be read ({error})"
                return
            if not isinstance(message, dict):
                continue
            if message.get("ready") is True and not self.sent:
                self.sent = True
                send_frame(write_fd, self.cases)
            elif "result" in message:
                self.message = message
                return

    @property
    def result(self) -> WorkerReport:
        return WorkerReport.of(self.message, None if self.message is not None else self.problem)
