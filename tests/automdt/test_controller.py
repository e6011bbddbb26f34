"""The controller: what a policy sees each interval, incl. the TCP loss ratio, and what it logs."""
from __future__ import annotations

import io
import json

from automdt.controller import Controller
from automdt.transfer_engine.engine import BufferStats, SenderStats, StageStats


class Recorder:
    name = "recorder"

    def __init__(self):
        self.seen = []

    def reset(self, max_threads, seed=None):
        return (2, 3, 4)

    def act(self, obs):
        self.seen.append(obs)
        return (3, 3, 4)


def _stats(t, nbytes, segs, retrans):
    st = StageStats(nbytes, 0.5 * t, 0.1 * t, 0.0, 2, 2)
    buf = BufferStats(16 << 20, 64 << 20, 4, 16, 16, 4)
    return SenderStats(t, st, st, buf, 0, 0, 0, 0, 0, segs, retrans)


def _rx(nbytes):
    st = {"bytes": nbytes, "busy_s": 0.1, "wait_s": 0.0}
    return {"write": st, "recv": st, "buffer": {"capacity_bytes": 64 << 20, "fill_bytes": 0}}


def test_loss_ratio_from_tcp_counters_reaches_the_policy_and_the_log():
    pol, applied, log = Recorder(), [], io.StringIO()
    c = Controller(pol, applied.append, interval_s=1.0, max_threads=8, log_file=log)
    assert c.start() == (2, 3, 4) and applied == [(2, 3, 4)]
    assert c.tick(_stats(0.0, 0, 1000, 5), _rx(0), now=100.0) is None  # the first call sets the baseline
    assert c.tick(_stats(0.5, 10, 1100, 5), _rx(10), now=100.5) is None  # interval not over yet
    rec = c.tick(_stats(1.0, 40 << 20, 3000, 25), _rx(40 << 20), now=101.0)
    assert rec is not None
    # 20 of the 2000 segments sent in the interval were retransmitted
    assert pol.seen[-1].loss == 20 / 2000
    assert rec["loss"] == 0.01
    assert rec["threads"] == {"read": 2, "net": 3, "write": 4}
    assert rec["next_threads"] == {"read": 3, "net": 3, "write": 4} and applied[-1] == (3, 3, 4)
    assert json.loads(log.getvalue().splitlines()[-1])["loss"] == 0.01
    # no retransmits in the next interval: no loss; an explicit value overrides the counters
    c.tick(_stats(2.0, 80 << 20, 5000, 25), _rx(80 << 20), now=102.0)
    assert pol.seen[-1].loss == 0.0
    c.tick(_stats(3.0, 90 << 20, 6000, 90), _rx(90 << 20), now=103.0, loss=0.25)
    assert pol.seen[-1].loss == 0.25
    assert rec["throughput"]["net"] == 40 << 20
