"""Case 1: a chaos proxy on the data connections flips, truncates, resets and stalls them."""
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from automdt.sender import run_transfer  # noqa: E402
from tests.faults.chaos import HDR_LEN, HELLO_LEN, ChaosProxy, Plan, frame_payload_offset  # noqa: E402
from tests.faults.helpers import (Outside, assert_final_names_ok, bytes_still_needed, final_files, opts,  # noqa: E402
                                  source_versions, temporaries)
from tests.util import CHUNK, trees_identical  # noqa: E402

FILES = {"a.bin": 20 * CHUNK, "b.bin": 12 * CHUNK, "sub/c.bin": 9 * CHUNK}


def _run(src, dst, proxy, **kw):
    t0 = time.monotonic()
    s = run_transfer(src, dst, opts(data_endpoint_hook=proxy.hook, **kw))
    return s, time.monotonic() - t0


def _complete(src, dst, s):
    assert s.exit_code == 0, s.errors
    ok, diff = trees_identical(src, dst)
    assert ok, diff
    assert temporaries(dst) == []


def test_flipped_payload_byte_is_detected_and_resent(make_tree, tmp_path):
    src = make_tree(FILES)
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst])
    # byte 100 of the first frame's payload, on each of the first three connections
    with ChaosProxy([Plan("flip", at=frame_payload_offset(0, CHUNK, 100))] * 3) as px:
        s, _ = _run(src, dst, px)
    assert px.fired >= 1
    _complete(src, dst, s)
    assert s.chunks_resent >= px.fired and s.integrity_failures == 0
    guard.check()


def test_flipped_bytes_in_several_frames_on_every_connection_are_resent(make_tree, tmp_path):
    src = make_tree(FILES)
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst])
    # frames 0, 2 and 5 of each of the first three connections: a byte in the middle of the payload
    plan = Plan("frames", frames=[0, 2, 5], frame_byte=CHUNK // 2)
    with ChaosProxy([plan] * 3) as px:
        s, _ = _run(src, dst, px)
    corrupted = sum(r.frames_corrupted for r in px.records)
    assert corrupted >= 3
    _complete(src, dst, s)
    assert s.chunks_resent >= corrupted
    guard.check()


@pytest.mark.parametrize("field,byte,xor", [("magic", 0, 0x01), ("offset-low-bits", 8, 0x01), ("length", 16, 0x01),
                                            ("flags", 20, 0x01), ("hash", 24, 0x01), ("unknown-file-id", 7, 0x80)])
def test_flipped_frame_header_field_is_refused_or_resent(make_tree, tmp_path, field, byte, xor):
    """A header byte flipped into an invalid header: the frame is refused (protocol error,
    connection closed, its chunks found missing and re-sent) or its chunk fails its hash
    (re-sent); never written wrong."""
    src = make_tree(FILES)
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst])
    with ChaosProxy([Plan("frames", frames=[1], target="header", frame_byte=byte, xor=xor)] * 3) as px:
        s, _ = _run(src, dst, px)
    assert px.fired >= 1
    _complete(src, dst, s)
    guard.check()


SAME_SIZE = {"a.bin": 8 * CHUNK, "b.bin": 8 * CHUNK, "c.bin": 8 * CHUNK, "d.bin": 8 * CHUNK, "e.bin": 64 * CHUNK}


class _Once:
    """Rewrite the first frame (on any connection) that ``pick`` accepts, once."""

    def __init__(self, pick):
        self.pick, self.done = pick, False

    def __call__(self, idx, f):
        if self.done:
            return None
        new = self.pick(f)
        if new is not None:
            self.done = True
        return new


def _to_later_file(f):
    magic, fid, off, length, flags, h = f
    # a.bin (id 0) -> d.bin (id 3), same size, read much later
    return (magic, 3, off, length, flags, h) if fid == 0 else None


def _to_last_chunk(f):
    magic, fid, off, length, flags, h = f
    # an early chunk of e.bin (id 4, 64 chunks) -> its last chunk, read much later
    return (magic, fid, 63 * CHUNK, length, flags, h) if fid == 4 and off < 8 * CHUNK else None


@pytest.mark.parametrize("pick", [_to_later_file, _to_last_chunk], ids=["file_id", "offset"])
def test_frame_header_corrupted_into_another_valid_header_is_not_written(make_tree, tmp_path, pick):
    """The header of the first frame of the first connection arrives with another file's id (or
    another chunk's offset) whose chunk has not been written yet. The payload hash still matches
    (it covers only the payload), so only a hash that binds file and offset can catch this."""
    src = make_tree(SAME_SIZE)
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst])
    with ChaosProxy([], default=Plan("frames", target="header", rewrite=_Once(pick))) as px:
        s, _ = _run(src, dst, px, threads=(1, 2, 1))
    assert px.fired == 1
    guard.check()
    assert_final_names_ok(dst, source_versions(src))  # nothing wrong under a final name
    _complete(src, dst, s)


def test_flipped_token_byte_rejects_the_connection_and_the_others_finish(make_tree, tmp_path):
    src = make_tree(FILES)
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst])
    with ChaosProxy([Plan("flip", at=HELLO_LEN - 1)]) as px:
        s, _ = _run(src, dst, px)
    assert px.fired == 1
    _complete(src, dst, s)
    guard.check()


@pytest.mark.parametrize("kind", ["truncate", "reset"])
@pytest.mark.parametrize("where", ["payload", "header"])
def test_connection_cut_inside_a_frame_is_recovered(make_tree, tmp_path, kind, where):
    src = make_tree(FILES)
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst])
    at = frame_payload_offset(2, CHUNK, 1000) if where == "payload" else frame_payload_offset(2, CHUNK, 0) - HDR_LEN + 7
    # the first three connections are cut (the second one later); reconnected ones pass
    with ChaosProxy([Plan(kind, at=at), Plan(kind, at=at + 5 * (HDR_LEN + CHUNK)), Plan(kind, at=at)]) as px:
        s, _ = _run(src, dst, px)
    assert px.fired >= 1
    _complete(src, dst, s)
    guard.check()


@pytest.mark.parametrize("kind", ["truncate", "reset"])
def test_every_connection_failing_ends_with_network_code_and_renames_nothing(make_tree, tmp_path, kind):
    src = make_tree(FILES)
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst])
    with ChaosProxy([], default=Plan(kind, at=frame_payload_offset(0, CHUNK, 1000))) as px:
        s, took = _run(src, dst, px, stall_s=2, retries=1, retry_sleep_s=0.2)
    assert s.exit_code == errors.NETWORK, s.errors
    assert took < 2 * 2 + 10, took  # two attempts, each ended by the stall limit
    assert len(px.records) >= 3 and px.fired >= 3
    assert final_files(dst) == {}
    assert s.bytes == 0
    guard.check()
    # the partials are kept; once the network is healthy the run completes
    s = run_transfer(src, dst, opts())
    _complete(src, dst, s)


def test_every_frame_corrupt_on_the_wire_ends_with_integrity_code_and_renames_nothing(make_tree, tmp_path):
    src = make_tree(FILES)
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst])
    with ChaosProxy([], default=Plan("frames", frame_byte=7)) as px:
        s, took = _run(src, dst, px, chunk_retries=2)
    assert s.exit_code == errors.INTEGRITY, s.errors
    assert s.integrity_failures >= 1
    assert final_files(dst) == {}
    guard.check()


def test_stalled_connection_is_handled_within_the_stall_limit(make_tree, tmp_path):
    """One of three connections goes silent mid-frame for good: the run ends within stall_s
    (exit 0, or exit 5 with partials kept), nothing wrong under a final name; the next run
    completes without resending what the journals hold."""
    src = make_tree(FILES)
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst])
    with ChaosProxy([], default=Plan("stall", at=frame_payload_offset(0, CHUNK, 1000), limit=1)) as px:
        s, took = _run(src, dst, px, stall_s=3, timeout_s=5, retries=1, retry_sleep_s=0.2)
    assert px.fired == 1
    assert s.exit_code in (0, errors.NETWORK), s.errors
    assert took < 2 * 3 + 8, took
    assert_final_names_ok(dst, source_versions(src))
    guard.check()
    need, _ = bytes_still_needed(src, dst, CHUNK)
    s2 = run_transfer(src, dst, opts())
    _complete(src, dst, s2)
    assert need <= s2.bytes <= need + 3 * CHUNK, (need, s2.bytes)


def test_temporary_stall_recovers(make_tree, tmp_path):
    src = make_tree(FILES)
    dst = str(tmp_path / "dst")
    with ChaosProxy([Plan("stall", at=frame_payload_offset(1, CHUNK, 1000), stall_s=1.5)] * 3) as px:
        s, took = _run(src, dst, px, stall_s=8)
    assert px.fired >= 1
    _complete(src, dst, s)
