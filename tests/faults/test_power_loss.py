"""Power cuts on a real ext4 (tests.faults.crashdisk): the harness loses what a disk loses, and
after every cut the same command repairs the destination, at the cost of what was at risk.

The default suite cuts at a handful of moments per --fsync setting; the ``expensive`` case runs
the 300-point plan of ``python -m tests.faults.powerloss``."""
import os

import pytest

from tests.faults.crashdisk import CrashDisk, available
from tests.faults.powerloss import make_source, plan, run_point

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("powerloss")


@pytest.fixture(scope="module")
def source(work):
    src = str(work / "src")
    return src, make_source(src)


@pytest.fixture(scope="module")
def disks(work):
    """One crash disk per ext4 mode, made when first asked for."""
    made = {}

    def get(fs_mode):
        if fs_mode not in made:
            made[fs_mode] = CrashDisk(str(work / fs_mode), fs_mode=fs_mode)
        return made[fs_mode]

    yield get
    for d in made.values():
        d.close()


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_the_disk_keeps_what_was_flushed_and_loses_the_rest(work):
    """The harness itself: a file fsynced (with its directory) survives the cut whole; one written
    after the last flush does not, though the dying machine could still read it."""
    with CrashDisk(str(work / "self"), size=32 << 20, fs_mode="still") as d:
        mnt = d.mount()
        kept, lost = os.path.join(mnt, "kept"), os.path.join(mnt, "lost")
        data = os.urandom(3 << 20)
        with open(kept, "wb") as f:
            f.write(data)
        _fsync(kept)
        _fsync(mnt)
        d.control("flush")  # no write of the kept file is pending
        flushes = d.stats()["flushes"]
        with open(lost, "wb") as f:
            f.write(data)
        assert open(lost, "rb").read() == data
        cut = d.cut("flushed", 0)
        assert cut["flushes"] == flushes and cut["kept"] == 0
        mnt = d.reboot()
        assert open(os.path.join(mnt, "kept"), "rb").read() == data
        lost = os.path.join(mnt, "lost")
        assert not os.path.exists(lost) or open(lost, "rb").read() != data


@pytest.mark.parametrize("fs_mode,fsync", [("writeback", "end"), ("ordered", "dir")])
def test_a_cut_right_after_exit_0_loses_nothing_and_the_rerun_sends_nothing(disks, source, work, fs_mode, fsync):
    src, digests = source
    rec = run_point(disks(fs_mode), src, digests, cut_at=None, model="reorder", seed=3, fsync=fsync, state=str(work / "state"))
    assert rec["first_exit"] == 0, rec
    assert rec["intact_after_cut"] == len(digests) and rec["rerun_sent"] == 0, rec
    assert rec["ok"], rec["problems"]


@pytest.mark.parametrize("fs_mode,fsync,model,cut_at", [
    ("ordered", "end", "reorder", 1.2), ("writeback", "end", "prefix", 2.4), ("writeback", "none", "flushed", 1.8),
    ("ordered", "file", "reorder", 1.5), ("writeback", "dir", "prefix", 2.0)])
def test_a_cut_during_the_transfer_is_repaired_by_the_same_command(disks, source, work, fs_mode, fsync, model, cut_at):
    """The rerun (a new boot) exits 0 with every file the source's bytes; with file and dir it
    sends only the files the cut took (a file with its name is intact)."""
    src, digests = source
    rec = run_point(disks(fs_mode), src, digests, cut_at=cut_at, model=model, seed=int(cut_at * 10), fsync=fsync,
                    state=str(work / "state"))
    assert rec["ok"], rec
    assert rec["rerun_exit"] == 0
    if fsync in ("file", "dir"):
        assert rec["damaged_after_cut"] == 0
        assert rec["rerun_sent"] == len(digests) - rec["intact_after_cut"], rec


@pytest.mark.expensive
def test_three_hundred_cuts_over_datasets_models_and_settings(work):
    """The plan of ``python -m tests.faults.powerloss``: 300 points, cut moments spread over the
    transfer and after success, three device models, two ext4 modes, four --fsync settings, four
    datasets (mixed, many small files, a few large ones, a deep tree)."""
    disks, sources, failed = {}, {}, []
    try:
        for p in plan(300, seed=7):
            if p["dataset"] not in sources:
                src = str(work / ("src-" + p["dataset"]))
                sources[p["dataset"]] = (src, make_source(src, 7, p["dataset"]))
            d = disks.get(p["fs_mode"])
            if d is None:
                d = disks[p["fs_mode"]] = CrashDisk(str(work / ("plan-" + p["fs_mode"])), fs_mode=p["fs_mode"])
            src, digests = sources[p["dataset"]]
            rec = run_point(d, src, digests, cut_at=p["cut_at"], model=p["model"], seed=p["seed"], fsync=p["fsync"],
                            state=str(work / "state"))
            if not rec["ok"]:
                failed.append(rec)
    finally:
        for d in disks.values():
            d.close()
    assert not failed, failed[:3]
