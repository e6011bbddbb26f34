"""TCP_INFO counters of the sender's data connections (the network stage's loss ratio)."""
from __future__ import annotations

from .conftest import wait_for

CHUNK = 64 * 1024


def test_segment_counters_grow_and_survive_closed_connections(rig):
    r = rig(chunk=CHUNK, threads=(2, 3, 2))
    r.add(1, 40 * CHUNK)
    r.wait_done([1])
    wait_for(lambda: r.tx.stats().chunks_pending == 0, what="sender drained")
    before = r.tx.stats()
    # 2.5 MiB cannot leave in fewer than 2.5 MiB / 64 KiB segments (the largest GSO segment)
    assert before.tcp_segs_out >= 40
    assert 0 <= before.tcp_retrans <= before.tcp_segs_out
    r.tx.set_threads(2, 0)  # every connection closes: its counts move to the closed totals
    wait_for(lambda: r.tx.stats().net.threads_live == 0, what="network threads gone")
    after = r.tx.stats()
    assert after.tcp_segs_out >= before.tcp_segs_out
    assert after.tcp_retrans >= before.tcp_retrans
    r.tx.set_threads(2, 2)
    r.add(2, 10 * CHUNK)
    r.wait_done([2])
    assert r.tx.stats().tcp_segs_out > after.tcp_segs_out
    r.assert_identical(2)
