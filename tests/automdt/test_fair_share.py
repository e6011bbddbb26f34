"""The receiver's fair share (on by default): sessions that want more get equal receiving rates;
one held back by its own path keeps what it gets."""
import os
import threading
import time

import pytest

from automdt import fair_share
from automdt.fair_share import HEADROOM, caps

MiB = 1 << 20


def test_sessions_with_a_backlog_share_what_the_others_leave_evenly():
    got = caps({"a": 12e6, "b": 4e6, "c": 1e6}, {"a": True, "b": True, "c": False}, 17e6)
    assert got["a"] == got["b"] == int(8e6 * (1 + HEADROOM))  # (17 - 1) / 2 each
    assert got["c"] == 0  # no backlog, less than a share: what it uses
    # the share comes from the capacity, not from what they get now: no spiral down
    assert caps({"a": 3e6, "b": 1e6}, {"a": True, "b": True}, 20e6)["a"] == int(10e6 * (1 + HEADROOM))
    # one that says it has no backlog but uses more than its share is held to it too
    assert caps({"a": 12e6, "b": 3e6}, {"a": False, "b": True}, 15e6) == {"a": 7875000, "b": 7875000}
    assert caps({"a": 12e6, "b": 4e6}, {"a": False, "b": False}, 16e6) == {"a": 0, "b": 0}  # no one waits
    # a newcomer counts for its share at once, and runs free while it starts
    assert caps({"a": 12e6, "b": None}, {"a": False, "b": False}, 16e6) == {"a": int(8e6 * (1 + HEADROOM)), "b": 0}
    assert caps({"a": 12e6}, {"a": True}, 16e6) == {"a": 0}  # alone
    assert caps({}, {}, 0.0) == {}


def test_a_session_held_back_elsewhere_keeps_what_it_uses():
    rates, backlog = {"a": 4e6, "b": 10e6}, {"a": True, "b": True}
    assert caps(rates, backlog, 21e6) == {"a": int(10.5e6 * 1.05), "b": int(10.5e6 * 1.05)}
    assert caps(rates, backlog, 21e6, elsewhere={"a"}) == {"a": 0, "b": 0}  # b alone shares the rest
    assert caps({**rates, "c": 9e6}, {**backlog, "c": True}, 21e6, elsewhere={"a"})["b"] == int(8.5e6 * 1.05)


def test_a_rate_needs_a_whole_window():
    r = fair_share._Rate()
    assert r.add(0.0, 0) is None and r.add(1.0, 10) is None
    assert r.add(fair_share.WINDOW_S, 40) == pytest.approx(40 / fair_share.WINDOW_S)
    r.add(fair_share.WINDOW_S + 1.0, 50)
    assert r.add(fair_share.WINDOW_S + 2.0, 60) == pytest.approx((60 - 40) / 2.0)


pytest.importorskip("automdt.transfer_engine._engine")

from automdt.receiver import ReceiverServer  # noqa: E402
from automdt.sender import TransferOptions, run_transfer  # noqa: E402
from tests.util import trees_identical  # noqa: E402


def _two_at_once(tmp_path, tag, mib, server_kw, options, after_s):
    """Two jobs of ``mib`` MiB each (a list) into one receiver (``server_kw``), each sent with its
    ``options`` (TransferOptions keywords), at once: the rates each receives over the 2 s that
    follow ``after_s`` seconds of both running, lowest first. Both trees arrive whole."""
    root = tmp_path / f"root-{tag}"
    root.mkdir()
    srcs = []
    for i in range(2):
        src = tmp_path / f"src-{tag}{i}"
        src.mkdir()
        (src / "a.bin").write_bytes(os.urandom(mib[i] * MiB))
        srcs.append(src)
    srv = ReceiverServer(str(root), "127.0.0.1", 0, **server_kw).start()
    results = [None, None]
    try:
        def send(i):
            results[i] = run_transfer(str(srcs[i]), f"127.0.0.1:{srv.port}/d{i}",
                                      TransferOptions(chunk_size=MiB, **options[i]))

        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while len([s for s in list(srv.sessions.values()) if s.engine is not None]) < 2:
            assert time.monotonic() < deadline, "two sessions never open"
            time.sleep(0.05)
        engines = [s.engine for s in list(srv.sessions.values()) if s.engine is not None]
        time.sleep(after_s)
        a = [e.stats().recv.bytes for e in engines]
        time.sleep(2.0)
        b = [e.stats().recv.bytes for e in engines]
        for t in threads:
            t.join()
    finally:
        srv.stop()
    for i, r in enumerate(results):
        assert r.exit_code == 0 and trees_identical(str(srcs[i]), str(root / f"d{i}"))
    return sorted((y - x) / 2.0 for x, y in zip(a, b))


def test_jobs_held_back_by_their_own_paths_are_not_held_to_one_rate(tmp_path):
    """Two jobs from two paths, 4 and 16 MB/s (each sender's own network limit), into one
    receiver with nothing shared between them: after a while each gets what its path gives."""
    slow, fast = _two_at_once(tmp_path, "paths", [80, 300], {"max_memory": 8 * MiB},
                              [{"threads": (1, 4, 2), "memory": 8 * MiB, "throttle": {"net": (0, rate)}}
                               for rate in (4_000_000, 16_000_000)], after_s=14.0)
    assert fast > 0.85 * 16_000_000, (slow, fast)
    assert slow > 0.85 * 4_000_000, (slow, fast)


def _two_jobs(tmp_path, fair):
    """Two jobs into one emulated 8 MB/s disk, one writing with 1 thread and the other with 4
    (on the disk's one clock, 1:4 of it): their receiving rates once both run (the divider
    measures over 2 s and acts every second)."""
    return _two_at_once(tmp_path, f"disk{int(fair)}", [48, 48],
                        {"max_memory": 4 * MiB, "disk_throttle": (0, 8_000_000), "fair_share": fair},
                        [{"threads": (1, 2, w), "memory": 4 * MiB} for w in (1, 4)], after_s=4.0)


def _jain(xs):
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def test_two_jobs_on_one_disk_get_equal_rates_with_the_fair_share(tmp_path):
    rates = _two_jobs(tmp_path, fair=False)
    assert _jain(rates) < 0.9, rates  # the check can fail: without it, about 1:4
    rates = _two_jobs(tmp_path, fair=True)
    assert _jain(rates) >= 0.95, rates
    assert sum(rates) > 0.85 * 8_000_000, rates  # the disk stays full
