"""One receiver, several senders at once, within one budget: the staging memory, the write
threads and the data connections of all sessions together stay within --total-memory,
--total-threads and --total-connections, shared evenly and given back as sessions end; every tree
arrives whole."""
import os
import threading
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt.receiver import ReceiverServer  # noqa: E402
from automdt.sender import TransferOptions, run_transfer  # noqa: E402
from tests.util import trees_identical  # noqa: E402

MiB = 1 << 20


def _open_engines(srv):
    for _ in range(5):  # the serving loop may change the dict while it is read
        try:
            return [s.engine for s in list(srv.sessions.values()) if s.engine is not None]
        except RuntimeError:
            time.sleep(0.001)
    return []


def test_many_sessions_share_the_receivers_budget_and_get_it_back(tmp_path):
    budget_memory, budget_threads, budget_connections, senders = 6 * MiB, 6, 6, 3
    root = tmp_path / "root"
    root.mkdir()
    srcs = []
    for i in range(senders):
        src = tmp_path / f"src{i}"
        src.mkdir()
        for j in range(3):
            (src / f"f{j}.bin").write_bytes(os.urandom(6 * MiB))
        srcs.append(src)
    srv = ReceiverServer(str(root), "127.0.0.1", 0, max_threads=16, max_memory=8 * MiB,
                         total_memory=budget_memory, total_threads=budget_threads,
                         total_connections=budget_connections).start()
    results = [None] * senders
    asked = [[] for _ in range(senders)]  # (time, network threads its controller applied), per sender
    worst = {"memory": 0, "threads": 0, "sessions": 0}
    all_open_since, moments = None, []
    try:
        def send(i):
            opts = TransferOptions(threads=(2, 4, 8), memory=8 * MiB, chunk_size=MiB,
                                   throttle={"write": (2 * MiB, 0)},
                                   progress=lambda summary, ctrl: asked[i].append((time.monotonic(), ctrl.threads[1])))
            results[i] = run_transfer(str(srcs[i]), f"127.0.0.1:{srv.port}/d{i}", opts)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            engines = _open_engines(srv)
            stats = [e.stats() for e in engines]
            worst["sessions"] = max(worst["sessions"], len(stats))
            worst["memory"] = max(worst["memory"], sum(st.buffer.capacity_bytes for st in stats))
            worst["threads"] = max(worst["threads"], sum(st.write.threads_target for st in stats))
            # a sender hears of a smaller share with its next poll (every few ms)
            all_open_since = (all_open_since or time.monotonic()) if len(stats) == senders else None
            if all_open_since is not None and time.monotonic() - all_open_since > 0.3:
                moments.append(time.monotonic())
            time.sleep(0.02)
        for t in threads:
            t.join()
        assert worst["sessions"] == senders, worst  # they did run at once
        assert worst["memory"] <= budget_memory and worst["threads"] <= budget_threads, worst
        # each asked for 4 network threads; together they run within the 6 connections
        running = [sum(next((n for t, n in reversed(a) if t <= m), 0) for a in asked) for m in moments]
        assert moments and max(running) <= budget_connections, running
        for i, r in enumerate(results):
            assert r.exit_code == 0, r.errors
            assert trees_identical(str(srcs[i]), str(root / f"d{i}"))
        # alone again, a session gets the whole budget
        assert srv.shares() == (budget_memory, budget_threads, budget_connections)
        alone = run_transfer(str(srcs[0]), f"127.0.0.1:{srv.port}/alone",
                             TransferOptions(threads=(2, 4, 8), memory=8 * MiB, chunk_size=MiB))
        assert alone.exit_code == 0
        assert alone.start["threads"]["net"] == 4 and alone.start["receiver_share"] == [6, 6]  # its own count
    finally:
        srv.stop()


def _rates(srv, senders, srcs, tag):
    """Run one transfer from each of ``srcs`` into ``srv`` at once; (seconds each took, all ok)."""
    took, ok = [0.0] * senders, [False] * senders

    def send(i):
        t0 = time.monotonic()
        r = run_transfer(str(srcs[i]), f"127.0.0.1:{srv.port}/{tag}{i}",
                         TransferOptions(threads=(2, 2, 4), memory=8 * MiB, chunk_size=MiB))
        took[i] = time.monotonic() - t0
        ok[i] = r.exit_code == 0 and trees_identical(str(srcs[i]), str(srv.root + f"/{tag}{i}"))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return took, all(ok)


def test_the_receivers_emulated_disk_is_one_disk_for_every_session(tmp_path):
    """``receive --throttle write.total=R``: sessions writing at once share R between them (two
    jobs take about twice as long as one), a job alone gets all of it, and write.thread limits
    each session's write threads."""
    rate, per_job = 16_000_000, 16 * MiB
    root = tmp_path / "root"
    root.mkdir()
    srcs = []
    for i in range(2):
        src = tmp_path / f"src{i}"
        src.mkdir()
        (src / "a.bin").write_bytes(os.urandom(per_job))
        srcs.append(src)
    srv = ReceiverServer(str(root), "127.0.0.1", 0, max_memory=8 * MiB, disk_throttle=(0, rate)).start()
    try:
        alone, ok = _rates(srv, 1, srcs, "alone")
        assert ok
        both, ok = _rates(srv, 2, srcs, "both")
        assert ok
    finally:
        srv.stop()
    ideal = per_job / rate
    assert 0.9 * ideal < alone[0] < 1.6 * ideal, (alone, ideal)
    # together: the disk's rate for both, so each takes about twice as long as alone
    assert min(both) > 1.6 * ideal and max(both) < 2.9 * ideal, (both, ideal)
    srv = ReceiverServer(str(root), "127.0.0.1", 0, max_memory=8 * MiB, disk_throttle=(2_000_000, 0)).start()
    try:
        took, ok = _rates(srv, 1, [srcs[0]], "thread")
    finally:
        srv.stop()
    assert ok
    # four write threads at 2 MB/s each: about 8 MB/s
    assert 0.85 * per_job / 8e6 < took[0] < 1.6 * per_job / 8e6, took
