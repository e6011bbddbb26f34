"""One receiver, several senders at once, within one budget: the staging memory and the write
threads of all sessions together stay within --total-memory and --total-threads, shared evenly
and given back as sessions end; every tree arrives whole."""
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
    budget_memory, budget_threads, senders = 6 * MiB, 6, 3
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
                         total_memory=budget_memory, total_threads=budget_threads).start()
    results = [None] * senders
    worst = {"memory": 0, "threads": 0, "sessions": 0}
    try:
        def send(i):
            opts = TransferOptions(threads=(2, 2, 8), memory=8 * MiB, chunk_size=MiB,
                                   throttle={"write": (2 * MiB, 0)})
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
            time.sleep(0.02)
        for t in threads:
            t.join()
        assert worst["sessions"] == senders, worst  # they did run at once
        assert worst["memory"] <= budget_memory and worst["threads"] <= budget_threads, worst
        for i, r in enumerate(results):
            assert r.exit_code == 0, r.errors
            assert trees_identical(str(srcs[i]), str(root / f"d{i}"))
        # alone again, a session gets the whole budget
        assert srv.shares() == (budget_memory, budget_threads)
        alone = run_transfer(str(srcs[0]), f"127.0.0.1:{srv.port}/alone",
                             TransferOptions(threads=(2, 2, 8), memory=8 * MiB, chunk_size=MiB))
        assert alone.exit_code == 0
    finally:
        srv.stop()
