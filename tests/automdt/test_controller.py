"""The controller: what a policy sees each interval, incl. the TCP loss ratio, and what it logs."""
from __future__ import annotations

import io
import json
import os

from automdt.controller import Controller
from automdt.policy_contract import Features, OwnStart, PolicyBase
from automdt.transfer_engine.engine import BufferStats, ReceiverStats, SenderStats, StageStats


class Recorder:
    """Starts at ``start``, then asks for ``ask`` every interval, and keeps what it saw."""

    name = "recorder"

    def __init__(self, start=(2, 3, 4), ask=(3, 3, 4)):
        self.seen = []
        self._start, self._ask = start, ask

    def reset(self, max_threads, seed=None):
        return self._start

    def act(self, obs):
        self.seen.append(obs)
        return self._ask


def _stats(t, nbytes, segs, retrans, threads=(2, 3)):
    """Sender counters as the engine reports them: ``threads``, the (read, net) counts it runs."""
    read = StageStats(nbytes, 0.5 * t, 0.1 * t, 0.0, threads[0], threads[0])
    net = StageStats(nbytes, 0.5 * t, 0.1 * t, 0.0, threads[1], threads[1])
    buf = BufferStats(16 << 20, 64 << 20, 4, 16, 16, 4)
    return SenderStats(t, read, net, buf, 0, 0, 0, 0, 0, segs, retrans)


def _rx(nbytes, write_threads=4):
    """The receiver's counters as the sender reads them from a ``status`` reply (plain JSON)."""
    st = {"bytes": nbytes, "busy_s": 0.1, "wait_s": 0.0, "threads_target": write_threads}
    return ReceiverStats.from_json({"write": st, "recv": st, "buffer": {"capacity_bytes": 64 << 20, "fill_bytes": 0}})


def test_loss_ratio_from_tcp_counters_reaches_the_policy_and_the_log():
    pol, applied, log = Recorder(), [], io.StringIO()
    c = Controller(pol, applied.append, interval_s=1.0, max_threads=8, log_file=log)
    assert c.start() == (2, 3, 4) and applied == [(2, 3, 4)]
    assert c.tick(_stats(0.0, 0, 1000, 5), _rx(0), now=100.0) is None  # the first call sets the baseline
    assert c.tick(_stats(0.5, 10, 1100, 5), _rx(10), now=100.5) is None  # interval not over yet
    record = c.tick(_stats(1.0, 40 << 20, 3000, 25), _rx(40 << 20), now=101.0)
    assert record is not None
    rec = record.to_json()
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


def test_the_policy_sees_and_the_log_shows_the_counts_the_engines_run():
    """The receiver clamps write threads to its --max-threads: the observation and the record carry
    the count it reports, not the one asked for; the controller never asks above the bound of the
    receiver's ``opened`` reply (``write_max``)."""
    pol, applied = Recorder((2, 3, 8), (8, 8, 8)), []
    c = Controller(pol, applied.append, interval_s=1.0, max_threads=8)
    c.start()
    c.tick(_stats(0.0, 0, 0, 0), _rx(0, write_threads=2), now=10.0)
    rec = c.tick(_stats(1.0, 1 << 20, 0, 0), _rx(1 << 20, write_threads=2), now=11.0)
    assert pol.seen[-1].threads == (2, 3, 2) and rec.threads == (2, 3, 2)
    assert rec.to_json()["threads"] == {"read": 2, "net": 3, "write": 2}
    assert applied[-1] == (8, 8, 8)
    # told the receiver's bound, the controller applies and logs what will run
    pol, applied = Recorder((2, 3, 8), (8, 8, 8)), []
    c = Controller(pol, applied.append, interval_s=1.0, max_threads=8, write_max=2)
    assert c.start() == (2, 3, 2) and applied == [(2, 3, 2)]
    c.tick(_stats(0.0, 0, 0, 0), _rx(0, write_threads=2), now=10.0)
    rec = c.tick(_stats(1.0, 1 << 20, 0, 0), _rx(1 << 20, write_threads=2), now=11.0)
    assert rec.next_threads == (8, 8, 2) and applied[-1] == (8, 8, 2)
    # before the receiver's first reply the write count is the one applied
    assert c.running(_stats(1.0, 0, 0, 0, threads=(8, 8)), None) == (8, 8, 2)


def test_the_receivers_share_bounds_network_and_write_counts_and_follows_it_both_ways():
    """A receiver serving several jobs gives each a share of its connections and write threads: the
    controller starts within it, brings running counts down at once when it shrinks (another job
    joined), and lets the policy have more again when it grows (a job ended)."""
    pol, applied = Recorder((4, 16, 16), (6, 16, 16)), []
    c = Controller(pol, applied.append, interval_s=1.0, max_threads=32)
    c.set_share(8, 12)
    assert c.start() == (4, 8, 12) and applied == [(4, 8, 12)]
    c.set_share(3, 5)  # more jobs: what runs comes down before the policy is asked again
    assert applied[-1] == (4, 3, 5) and c.threads == (4, 3, 5)
    c.tick(_stats(0.0, 0, 0, 0, threads=(4, 3)), _rx(0, write_threads=5), now=10.0)
    rec = c.tick(_stats(1.0, 1 << 20, 0, 0, threads=(4, 3)), _rx(1 << 20, write_threads=5), now=11.0)
    assert rec.next_threads == (6, 3, 5) and applied[-1] == (6, 3, 5)
    n = len(applied)
    c.set_share(3, 5)  # the same share again: nothing to do
    assert len(applied) == n
    c.set_share(20, 20)  # jobs ended: nothing forced up, the policy's next ask gets its 16s
    assert len(applied) == n
    rec = c.tick(_stats(2.0, 2 << 20, 0, 0, threads=(6, 3)), _rx(2 << 20, write_threads=5), now=12.0)
    assert rec.next_threads == (6, 16, 16)


def test_receiver_stats_cross_the_control_channel_typed():
    """What the receiver puts in its ``status`` reply is what the sender reads back, field for field;
    a counter an older receiver does not send reads as 0."""
    stage = StageStats(5 << 20, 1.5, 0.25, 0.0, 3, 2)
    st = ReceiverStats(12.5, stage, stage._replace(threads_target=4), BufferStats(1, 2, 3, 4, 5, 6),
                       7, 0, 1, 0, 2, 9, 1, 0)
    wire = json.loads(json.dumps(st.to_json()))
    assert wire["write"]["threads_target"] == 4 and wire["buffer"]["fill_bytes"] == 1
    assert ReceiverStats.from_json(wire) == st
    old = ReceiverStats.from_json({"write": {"bytes": 10}, "buffer": {"capacity_bytes": 64}})
    assert old.write.bytes == 10 and old.write.threads_target == 0 and old.recv.bytes == 0
    assert old.buffer.capacity_bytes == 64 and old.connections == 0


def test_interval_log_lines_round_trip_byte_for_byte():
    from automdt.interval import IntervalRecord

    log = io.StringIO()
    c = Controller(Recorder(), lambda t: None, interval_s=1.0, max_threads=8, log_file=log)
    c.annotations["throttle"] = "read.total=10M"
    c.start()
    c.tick(_stats(0.0, 0, 1000, 5), _rx(0), now=100.0)
    c.tick(_stats(1.0, 40 << 20, 3000, 25), _rx(40 << 20), now=101.0)
    c.tick(_stats(1.5, 50 << 20, 3000, 25), _rx(50 << 20), now=101.5, final=True)
    lines = log.getvalue().splitlines()[1:]
    assert len(lines) == 2 and '"final": true' in lines[1] and '"throttle": "read.total=10M"' in lines[0]
    for line in lines:
        assert json.dumps(IntervalRecord.from_json(json.loads(line)).to_json()) == line
    assert list(json.loads(lines[0])) == ["t", "threads", "throughput", "buffer", "cpu", "loss", "policy",
                                          "next_threads", "bytes", "busy_s", "wait_s", "recv_wait_s", "interval_s",
                                          "throttle"]
    # keys of others (the experiments' round) survive, after the known ones
    extra = dict(json.loads(lines[0]), round=2)
    assert IntervalRecord.from_json(extra).to_json() == extra
    assert c.history[0].to_json() == json.loads(lines[0])


def test_threads_with_a_baseline_policy_start_its_state_there():
    """``--threads 3,2,1 --policy marlin`` (or falcon): the policy's own state starts at those
    counts, so its first interval is scored with the counts that ran."""
    from automdt.agents.falcon import FalconPolicy
    from automdt.agents.marlin import MarlinPolicy
    from automdt.start import choose_start

    for pol, seen in ((MarlinPolicy(), lambda p: [st.window[0][1] for st in p.stages]),
                      (FalconPolicy(), lambda p: [p._prev[0]])):
        applied = []
        c = Controller(pol, applied.append, interval_s=1.0, max_threads=8,
                       start=choose_start(pol, 8, explicit=(3, 2, 1)))
        assert c.start() == (3, 2, 1) and applied == [(3, 2, 1)]
        c.tick(_stats(0.0, 0, 0, 0, threads=(3, 2)), _rx(0, write_threads=1), now=10.0)
        rec = c.tick(_stats(1.0, 1 << 20, 0, 0, threads=(3, 2)), _rx(1 << 20, write_threads=1), now=11.0)
        assert rec.threads == (3, 2, 1)
        assert seen(pol) == ([3, 2, 1] if isinstance(pol, MarlinPolicy) else [2])


class _PPOish(Recorder, PolicyBase):
    """A policy that takes a start (as PPO does: its features name one)."""

    def features(self):
        return Features(start=OwnStart((2, 3, 4), "cold"))


def test_a_policy_that_takes_a_start_gets_two_half_intervals_first_then_steady_ones():
    pol, applied, log = _PPOish(), [], io.StringIO()
    c = Controller(pol, applied.append, interval_s=1.0, max_threads=8, log_file=log)
    assert c.early_intervals == (0.5, 0.5)
    c.start()
    assert c.tick(_stats(0.0, 0, 0, 0), _rx(0), now=100.0) is None
    assert c.tick(_stats(0.4, 1 << 20, 0, 0), _rx(1 << 20), now=100.4) is None
    first = c.tick(_stats(0.5, 2 << 20, 0, 0), _rx(2 << 20), now=100.5)
    assert first is not None and first.interval_s == 0.5 and pol.seen[-1].interval_s == 0.5
    assert first.throughput[0] == (2 << 20) / 0.5  # rates stay bytes per second
    assert c.tick(_stats(0.9, 3 << 20, 0, 0), _rx(3 << 20), now=100.9) is None
    assert c.tick(_stats(1.0, 4 << 20, 0, 0), _rx(4 << 20), now=101.0).interval_s == 0.5
    assert c.tick(_stats(1.5, 5 << 20, 0, 0), _rx(5 << 20), now=101.5) is None  # steady from now on
    assert c.tick(_stats(2.0, 6 << 20, 0, 0), _rx(6 << 20), now=102.0).interval_s == 1.0
    assert [json.loads(x)["interval_s"] for x in log.getvalue().splitlines()[1:]] == [0.5, 0.5, 1.0]


def test_early_intervals_are_on_by_default_never_for_baselines_and_set_by_the_settings():
    from automdt.controller import ControllerSettings

    assert Controller(Recorder(), lambda t: None, interval_s=2.0).early_intervals == ()  # Marlin & co.
    assert Controller(_PPOish(), lambda t: None, interval_s=2.0).early_intervals == (1.0, 1.0)  # two halves
    none = ControllerSettings(early_intervals=())
    assert Controller(_PPOish(), lambda t: None, interval_s=2.0, settings=none).early_intervals == ()
    three = ControllerSettings(early_intervals=(0.25, 0.75, 2.0))
    assert Controller(_PPOish(), lambda t: None, interval_s=1.0, settings=three).early_intervals == (0.25, 0.75, 1.0)
    assert Controller(Recorder(), lambda t: None, interval_s=1.0, settings=three).early_intervals == ()
    assert Controller(_PPOish(), lambda t: None, early_intervals=(3.0,)).early_intervals == (1.0,)
    log = io.StringIO()
    c = Controller(_PPOish(), lambda t: None, interval_s=1.0, log_file=log, settings=none)
    c.start()
    assert json.loads(log.getvalue())["controller"] == {"early_intervals": [], "end_hold": True, "warm_hold": True,
                                                         "tail_hold": True, "early_intervals_s": []}


def test_the_tail_holds_the_counts_and_is_marked():
    """Once the sender says the source is read to the end (``tail``), the policy is not asked: the
    counts hold while the buffers drain, and the records say ``"tail": true``."""
    pol, applied, log = Recorder(), [], io.StringIO()
    c = Controller(pol, applied.append, interval_s=1.0, max_threads=8, log_file=log)
    c.start()
    c.tick(_stats(0.0, 0, 0, 0), _rx(0), now=10.0)
    c.tick(_stats(1.0, 1 << 20, 0, 0), _rx(1 << 20), now=11.0)
    assert len(pol.seen) == 1 and c.threads == (3, 3, 4)
    c.tail = True
    rec = c.tick(_stats(2.0, 2 << 20, 0, 0, threads=(3, 3)), _rx(2 << 20), now=12.0)
    assert len(pol.seen) == 1, "the policy was asked in the tail"
    assert rec.next_threads == (3, 3, 4) and applied[-1] == (3, 3, 4) and len(applied) == 2
    assert json.loads(log.getvalue().splitlines()[-1])["tail"] is True
    assert "tail" not in json.loads(log.getvalue().splitlines()[-2])


def test_the_counts_hold_while_what_is_left_is_written_within_an_interval():
    """``to_deliver`` (the sender's bytes left to write at the destination) under one
    ``interval_s`` at the interval's write rate: the run is ending, the policy is not asked (a
    change has no time to pay back; the PPO policy's first call imports numpy), the records say
    ``"ending": true``. More left, or unknown: the policy is asked."""
    pol, applied, log = Recorder(), [], io.StringIO()
    c = Controller(pol, applied.append, interval_s=1.0, max_threads=8, log_file=log)
    c.start()
    c.tick(_stats(0.0, 0, 0, 0), _rx(0), now=10.0)
    c.to_deliver = 3 << 20  # 3 MiB left at 1 MiB/s: three intervals of writing
    c.tick(_stats(1.0, 1 << 20, 0, 0), _rx(1 << 20), now=11.0)
    assert len(pol.seen) == 1 and c.threads == (3, 3, 4)
    c.to_deliver = (1 << 20) - 1  # less than this interval's 1 MiB/s writes in one
    rec = c.tick(_stats(2.0, 2 << 20, 0, 0, threads=(3, 3)), _rx(2 << 20), now=12.0)
    assert len(pol.seen) == 1, "the policy was asked with under an interval of writing left"
    assert rec.next_threads == (3, 3, 4) and len(applied) == 2
    last = json.loads(log.getvalue().splitlines()[-1])
    assert last["ending"] is True and "tail" not in last
    assert "ending" not in json.loads(log.getvalue().splitlines()[-2])
    c.to_deliver = 2 << 20  # the readers may be done: what counts is what is left to write
    c.tick(_stats(3.0, 2 << 20, 0, 0, threads=(3, 3)), _rx(3 << 20), now=13.0)
    assert len(pol.seen) == 2
    c.to_deliver = None  # unknown: asked
    c.tick(_stats(4.0, 3 << 20, 0, 0, threads=(3, 3)), _rx(4 << 20), now=14.0)
    assert len(pol.seen) == 3


def test_the_end_hold_can_be_turned_off_for_comparisons():
    from automdt.controller import ControllerSettings

    pol = Recorder()
    c = Controller(pol, lambda t: None, interval_s=1.0, max_threads=8, settings=ControllerSettings(end_hold=False))
    c.start()
    c.tick(_stats(0.0, 0, 0, 0), _rx(0), now=10.0)
    c.to_deliver = 1  # one byte left: ending, were the hold on
    rec = c.tick(_stats(1.0, 1 << 20, 0, 0), _rx(1 << 20), now=11.0)
    assert len(pol.seen) == 1 and "ending" not in rec.extra


def test_the_sender_tells_the_controller_what_is_left_to_deliver(tmp_path, monkeypatch):
    """A real local transfer: at every tick the sender's :class:`Progress` says the bytes to send
    less what the receiver has written, from all of it to nothing."""
    from automdt import controller as ctl
    from automdt.sender import TransferOptions, run_transfer

    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}.bin").write_bytes(os.urandom(1 << 20))
    seen = []
    tick = ctl.Controller.tick

    def spy(self, sender_stats, receiver_stats, *a, **kw):
        progress = kw.get("progress")
        if receiver_stats is not None and not kw.get("final"):
            seen.append((progress.to_deliver if progress else None, receiver_stats.write.bytes))
        return tick(self, sender_stats, receiver_stats, *a, **kw)

    monkeypatch.setattr(ctl.Controller, "tick", spy)
    o = TransferOptions(threads=(2, 2, 2), memory=1 << 20, chunk_size=256 << 10, interval_s=0.1,
                        throttle={"read": (0.0, 3e6)})  # 6 MiB at 3 MB/s: about 2 s
    s = run_transfer(str(src), str(tmp_path / "dst"), o)
    assert s.exit_code == 0 and s.files_transferred == 6
    total = 6 << 20
    assert len(seen) > 5 and all(left is not None and left + written == total for left, written in seen), seen[:5]
    assert seen[0][0] > total // 2 and min(left for left, _ in seen) < total // 4



def test_a_warm_start_holds_until_the_pipeline_delivers_a_cold_one_does_not():
    """A history start is what the path needs: the first second, while the pipeline
    fills, and any interval before the receiver wrote something do not move it (the policy still
    sees them). A cold or profile start acts at once."""
    from automdt.start import Start

    for source, held in (("history", True), ("profile", False), ("cold", False)):
        pol, applied = _PPOish(), []
        c = Controller(pol, applied.append, interval_s=1.0, max_threads=8, start=Start((2, 3, 4), source))
        c.start()
        c.tick(_stats(0.0, 0, 0, 0), _rx(0), now=10.0)
        rec = c.tick(_stats(0.5, 1 << 20, 0, 0, threads=(2, 3)), _rx(0), now=10.5)  # read, nothing written
        assert len(pol.seen) == 1
        assert rec.next_threads == ((2, 3, 4) if held else (3, 3, 4)), source
        rec = c.tick(_stats(1.0, 2 << 20, 0, 0, threads=(2, 3)), _rx(1 << 20), now=11.0)  # delivered, 1 s: it acts
        assert rec.next_threads == (3, 3, 4), source


def test_what_the_policy_says_of_its_choice_goes_to_the_log():
    """A policy's ``annotation`` (the shield's: what it did) is added to the interval's record."""

    class Noting(Recorder, PolicyBase):
        def act(self, obs):
            self.note = {"guard": "raise"} if len(self.seen) == 1 else {}
            return super().act(obs)

        def annotation(self):
            return self.note

    pol, log = Noting(), io.StringIO()
    c = Controller(pol, lambda t: None, interval_s=1.0, max_threads=8, log_file=log)
    c.start()
    c.tick(_stats(0.0, 0, 0, 0), _rx(0), now=10.0)
    c.tick(_stats(1.0, 1 << 20, 0, 0), _rx(1 << 20), now=11.0)
    c.tick(_stats(2.0, 2 << 20, 0, 0), _rx(2 << 20), now=12.0)
    lines = [json.loads(x) for x in log.getvalue().splitlines()[1:]]
    assert lines[0].get("guard") is None and lines[1]["guard"] == "raise"


def test_a_policy_that_acts_in_the_tail_is_asked_there_others_hold():
    """The tail (the source read, the buffers draining) holds the counts of a policy that does not
    say it acts there; one that does (the capacity controller, under the shield too) is asked, and
    its records still say ``"tail": true``."""
    from automdt.agents.registry import make_policy
    from automdt.controller import ControllerSettings

    class InTail(Recorder, PolicyBase):
        def features(self):
            return Features(asked_in_tail=True)

    for pol, asked in ((Recorder(), False), (InTail(), True)):
        c = Controller(pol, lambda t: None, interval_s=1.0, max_threads=8)
        c.start()
        c.tick(_stats(0.0, 0, 0, 0), _rx(0), now=10.0)
        c.tail = True
        rec = c.tick(_stats(1.0, 1 << 20, 0, 0), _rx(1 << 20), now=11.0)
        assert rec.extra["tail"] is True and (len(pol.seen) == 1) == asked
    pol = Recorder()  # with tail_hold off every policy is asked there
    c = Controller(pol, lambda t: None, interval_s=1.0, max_threads=8, settings=ControllerSettings(tail_hold=False))
    c.start()
    c.tick(_stats(0.0, 0, 0, 0), _rx(0), now=10.0)
    c.tail = True
    c.tick(_stats(1.0, 1 << 20, 0, 0), _rx(1 << 20), now=11.0)
    assert len(pol.seen) == 1
    assert make_policy("default", 8).features().asked_in_tail
    assert not make_policy("shield:marlin", 8).features().asked_in_tail
