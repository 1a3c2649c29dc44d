"""labkit.instructor.wall.wire: every value, outcome and message that crosses the grader's wall, there and back."""

import os
import threading
import time

import pytest
import torch

from labkit.core.spec import ModelSpec
from labkit.core.timing import ScriptedClock
from labkit.exercises.calling import FLOOD_CHARS, Outcome
from labkit.exercises.checking import ReportedError
from labkit.instructor.wall import protocol, wire


def test_values_round_trip_bit_for_bit_and_objects_only_where_cases_go():
    clock = ScriptedClock(1.5)
    clock.advance(0.25)
    value = ((torch.tensor([1.5, float("nan")]), torch.arange(6).view(2, 3).t(), torch.tensor(True)),
             {"k": [1, None, "s"], 2: (3.5, float("-inf"))}, 2**70, [clock, clock])
    back = wire.decode(wire.encode(value, objects=True), objects=True)
    tensors, mapping, big, clocks = back
    assert all(torch.equal(a, b) or (a.isnan() | (a == b)).all() for a, b in zip(tensors, value[0]))
    assert [t.dtype for t in tensors] == [t.dtype for t in value[0]]
    assert mapping == {"k": [1, None, "s"], 2: (3.5, float("-inf"))} and big == 2**70
    assert type(clocks[0]) is ScriptedClock and clocks[0] is clocks[1]  # one object, referenced twice
    assert vars(clocks[0]) == vars(clock)
    spec = wire.decode(wire.encode(ModelSpec.__new__(ModelSpec), objects=True), objects=True)
    assert type(spec) is ModelSpec
    with pytest.raises(wire.WireError, match="does not carry"):
        wire.decode(wire.encode(clock, objects=True))  # an answer never becomes a labkit object


def test_an_outcome_round_trips_and_anything_malformed_is_an_error_never_a_pass():
    outcome = Outcome()
    outcome.value, outcome.printed, outcome.mutated = torch.tensor([0.25, 0.75]), "x" * (FLOOD_CHARS + 50), "edited"
    back = wire.outcome_from_plain(wire.outcome_to_plain(outcome, outcome.value, FLOOD_CHARS))
    assert torch.equal(back.value, outcome.value) and back.mutated == "edited"
    assert len(back.printed) == FLOOD_CHARS + 1 and back.error is None and not back.timed_out
    failed = Outcome()
    try:
        raise ValueError("shape mismatch\nsecond line")
    except ValueError as error:
        failed.error = error
    back = wire.outcome_from_plain(wire.outcome_to_plain(failed, None, FLOOD_CHARS))
    assert isinstance(back.error, ReportedError) and str(back.error).endswith("shape mismatch")
    for hostile in (None, {"value": {"__pickle__": 1}}, {"error": "not a pair"}):
        assert wire.outcome_from_plain(hostile).error is not None


def test_frames_carry_messages_up_to_a_cap_and_a_time_limit():
    read_end, write_end = os.pipe()
    try:
        protocol.send_frame(write_end, b"cases")
        protocol.send_frame(write_end, b"x" * 100)
        assert protocol.read_frame(read_end, cap=10) == b"cases"
        with pytest.raises(wire.WireError, match="more than the 10 allowed"):
            protocol.read_frame(read_end, cap=10)  # never read whole, never kept (the reader stops there)
        os.read(read_end, 100)
        started = time.monotonic()
        with pytest.raises(wire.WireError, match="in time"):
            protocol.read_frame(read_end, cap=10, timeout_s=0.2)  # a writer that says nothing blocks no one
        assert time.monotonic() - started < 5
        big = os.urandom(3 * 2**20)  # larger than a pipe's buffer: written while read
        writer = threading.Thread(target=protocol.send_frame, args=(write_end, big))
        writer.start()
        assert protocol.read_frame(read_end, cap=2**22, timeout_s=30) == big
        writer.join()
        os.close(write_end)
        write_end = None
        with pytest.raises(wire.WireError, match="ended"):
            protocol.read_frame(read_end, cap=10)
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)


def test_only_the_key_holder_signs():
    key = os.urandom(32)
    signed = protocol.sign(key, b'{"answers": {}}')
    assert protocol.unsign(key, signed) == b'{"answers": {}}'
    for forged in (b'{"answers": {}}', b"0" * 32 + b'{"answers": {}}', protocol.sign(os.urandom(32), b"go"),
                   signed[:-1] + b"!"):
        with pytest.raises(wire.WireError, match="not signed"):
            protocol.unsign(key, forged)


def test_the_kernels_end_writes_and_reads_json_as_json_does_and_frames_as_the_worker_reads():
    import json
    import math

    read_end, write_end = os.pipe()
    try:
        send, receive, encode, decode = protocol.kernel_end(write_end)
        value = {"answers": {"00.x": [1, -2.5, None, True, "caf\u00e9\n\"q\"", {"k": [math.inf]}]}, 3: "int key"}
        assert encode(value) == json.dumps(value)
        assert decode(json.dumps(value)) == json.loads(json.dumps(value))
        with pytest.raises(wire.WireError, match="not one JSON value"):
            decode('{"a": 1} x')
        with pytest.raises(TypeError, match="not plain data: ModelSpec"):
            encode({"spec": ModelSpec.__new__(ModelSpec)})
        send(b"answers")
        assert protocol.read_frame(read_end, cap=100, timeout_s=5) == b"answers"
        protocol.send_frame(write_end, b"cases")
        _, receive_here, _, _ = protocol.kernel_end(read_end)
        assert receive_here(100, 5) == b"cases"
    finally:
        os.close(read_end)
        os.close(write_end)
