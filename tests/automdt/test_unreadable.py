"""Nothing silently missing: what the sending user cannot read is an error of the run (exit 6),
named in the summary, and everything it can read arrives; `verify` says what it could not read.

The sender runs as root without the DAC capabilities (``setpriv --bounding-set=-dac_override,
-dac_read_search``), so file modes bind it as they bind an ordinary user, and the source tree is
listed independently by a small walker under the same restriction: the summary's counts must
account for every entry it sees.
"""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from tests.faults.helpers import temporaries  # noqa: E402

DROP = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]

WALKER = r"""
import hashlib, json, os, stat, sys
root = sys.argv[1]
out = {"files": {}, "unreadable": [], "skipped": []}
def walk(rel):
    path = os.path.join(root, rel) if rel else root
    try:
        names = sorted(os.listdir(path))
    except OSError:
        out["unreadable"].append(rel)
        return
    for n in names:
        r = f"{rel}/{n}" if rel else n
        try:
            st = os.lstat(os.path.join(root, r))
        except OSError:
            out["unreadable"].append(r)
            continue
        if stat.S_ISDIR(st.st_mode):
            walk(r)
        elif stat.S_ISREG(st.st_mode):
            try:
                with open(os.path.join(root, r), "rb") as f:
                    out["files"][r] = hashlib.sha256(f.read()).hexdigest()
            except OSError:
                out["unreadable"].append(r)
        else:
            out["skipped"].append(r)
walk("")
print(json.dumps(out))
"""


def _restricted(argv, **kw):
    return subprocess.run(DROP + argv, capture_output=True, text=True, timeout=120, **kw)


@pytest.fixture(scope="module")
def can_drop(tmp_path_factory):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop the DAC capabilities")
    probe = tmp_path_factory.mktemp("amdt-i12-probe") / "locked"
    probe.write_text("x")
    probe.chmod(0)
    r = _restricted(["cat", str(probe)])
    if r.returncode == 0:
        pytest.skip("setpriv could not drop CAP_DAC_OVERRIDE here")


def _tree_fixed(root):
    """Every kind of entry the sender can and cannot read."""
    def w(rel, data=b"", mode=0o644):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(mode)

    w("ok/a.txt", b"alpha")
    w("ok/deep/b.bin", os.urandom(300_000))
    w("ok/empty", b"")
    w("unreadable.bin", os.urandom(200_000), 0o000)
    w("unreadable-empty", b"", 0o000)
    w("locked/secret.txt", b"hidden")
    w("locked/inner/x", b"x")
    (root / "locked").chmod(0o000)  # cannot be listed
    w("noexec/c", b"c")
    (root / "noexec").chmod(0o644)  # listable, but its entries cannot be stat'ed
    w("writeonly.txt", b"w", 0o200)
    os.symlink("ok/a.txt", root / "link")
    os.mkfifo(root / "fifo")


def _tree_random(root, seed):
    rng = random.Random(seed)
    dirs = [root]
    for i in range(40):
        d = rng.choice(dirs)
        if rng.random() < 0.25:
            nd = d / f"d{i}"
            nd.mkdir()
            dirs.append(nd)
        else:
            p = d / f"f{i}"
            p.write_bytes(rng.randbytes(rng.choice([0, 1, 5000, 70_000])))
            p.chmod(rng.choice([0o644, 0o600, 0o000, 0o200, 0o444]))
    for d in dirs[1:]:
        d.chmod(rng.choice([0o755, 0o755, 0o755, 0o000, 0o644, 0o311]))


def _unlock(root):
    for dp, dns, fns in os.walk(root):
        for n in dns:
            os.chmod(os.path.join(dp, n), 0o755)
    os.chmod(root, 0o755)
    for dp, dns, fns in os.walk(root):
        for n in dns:
            os.chmod(os.path.join(dp, n), 0o755)


def _dest_files(dst):
    out = {}
    for dp, _, fns in os.walk(dst):
        for n in fns:
            p = os.path.join(dp, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, dst)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.mark.parametrize("kind", ["fixed", "random-1", "random-2"])
def test_nothing_silently_missing(kind, can_drop, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    if kind == "fixed":
        _tree_fixed(src)
    else:
        _tree_random(src, int(kind.split("-")[1]))
    dst = tmp_path / "dst"
    try:
        seen = json.loads(_restricted([sys.executable, "-c", WALKER, str(src)]).stdout)
        r = _restricted([sys.executable, "-m", "automdt", "transfer", str(src), str(dst), "--json", "--no-lock",
                         "--threads", "2,2,2", "--chunk-size", "64Ki"])
        s = json.loads(r.stdout.strip().splitlines()[-1])
        if kind == "fixed":
            assert seen["unreadable"] and seen["files"], seen  # the tree really has both
        # every file the user can read arrived, with its content; nothing else did
        assert _dest_files(str(dst)) == seen["files"]
        assert s["files_transferred"] == len(seen["files"]), s
        # every entry it cannot read is an error, with its path, exactly once on stderr
        assert s["files_failed"] + s["entries_unreadable"] == len(seen["unreadable"]), (s, seen["unreadable"])
        assert s["entries_skipped"] == len(seen["skipped"])
        for rel in seen["unreadable"]:
            assert sum(e.startswith(f"{rel}: ") for e in s["errors"]) == 1, (rel, s["errors"])
            assert sum(line.startswith(f"automdt: {rel}: ") for line in r.stderr.splitlines()) == 1, (rel, r.stderr)
        assert s["exit_code"] == (errors.FILES_FAILED if seen["unreadable"] else 0) == r.returncode, r.stderr
        assert temporaries(str(dst)) == []  # no .part or journal of a file that could not be read
        for rel in seen["unreadable"]:
            assert not os.path.exists(dst / rel), f"{rel} exists on the destination"
        # verify: the readable files are identical; the unreadable ones are reported as such
        v = _restricted([sys.executable, "-m", "automdt", "verify", str(src), str(dst), "--json", "--chunk-size", "64Ki"])
        out = json.loads(v.stdout)
        assert out["differences"] == [] and out["verified"] == len(seen["files"]), out
        assert sorted(line.split(" ")[1] for line in out["unreadable"]) == sorted(seen["unreadable"])
        assert v.returncode == (errors.FILES_FAILED if seen["unreadable"] else 0)
    finally:
        _unlock(src)


def test_verify_reports_what_the_destination_cannot_read(can_drop, tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for n in ("a", "b", "d/c"):
        (src / n).write_bytes(os.urandom(1000))
    dst = tmp_path / "dst"
    assert subprocess.run([sys.executable, "-m", "automdt", "transfer", str(src), str(dst), "--no-lock", "-q",
                           "--threads", "1,1,1"]).returncode == 0
    (dst / "b").chmod(0)
    (dst / "d").chmod(0)
    try:
        v = _restricted([sys.executable, "-m", "automdt", "verify", str(src), str(dst)])
        assert v.returncode == errors.FILES_FAILED, v.stdout + v.stderr
        lines = v.stdout.splitlines()
        assert "unreadable: b (destination): permission denied" in lines
        assert "unreadable: d/c (destination): permission denied" in lines
        assert lines[-1].startswith("1 of 3 files identical")
        assert not any(line.startswith(("missing:", "differs:")) for line in lines)
    finally:
        (dst / "d").chmod(0o755)
        (dst / "b").chmod(0o644)
