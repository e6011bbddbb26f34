"""Case 5: a fake sender speaking the control protocol (automdt.protocol.ControlClient) and the data
protocol (raw sockets, transfer_engine/PROTOCOL.md) sends hostile names and races symlinks into
the destination: everything refused or contained, nothing outside the root touched, and the
receiver still serves a normal transfer afterwards."""
import os
import threading
import unicodedata

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

import zmq  # noqa: E402

from automdt import durable, errors  # noqa: E402
from automdt.errors import AutomdtError  # noqa: E402
from automdt.paths import temp_names  # noqa: E402
from automdt.receiver import ReceiverServer  # noqa: E402
from automdt.sender import run_transfer  # noqa: E402
from tests.faults.helpers import FakeSender, Outside, opts, read, receiver_answers, wait_for  # noqa: E402
from tests.util import CHUNK, trees_identical, write_file  # noqa: E402

SECRET = b"hostile-suite-secret"
ESCAPES = ["/etc/x", "/tmp/x", "/x"]


@pytest.fixture
def env(tmp_path):
    """A receiver (in-process, with a secret) into tmp_path/root; tmp_path/outside holds files a
    hostile sender would like to overwrite; everything outside the root is guarded."""
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "victim.txt").write_bytes(b"do not touch\n")
    (outside / "dir" / "x").write_bytes(b"nor this\n")
    (outside / "big.bin").write_bytes(os.urandom(8 * CHUNK))
    os.chmod(outside / "big.bin", 0o600)
    pre_existing = {p: os.path.lexists(p) for p in ESCAPES}
    srv = ReceiverServer(str(root), "127.0.0.1", 0, secret=SECRET, idle_timeout_s=30).start()
    ctx = zmq.Context()
    e = type("Env", (), {})()
    e.root, e.outside, e.srv, e.ctx, e.tmp = root, outside, srv, ctx, tmp_path
    e.guard = Outside(tmp_path, [str(root)], allow_new=("src", "normal-src"))  # sources the tests make
    e.fake = lambda: FakeSender(ctx, srv.port, SECRET)
    try:
        yield e
        e.guard.check()
        for p, existed in pre_existing.items():
            assert os.path.lexists(p) == existed, f"{p} was created or removed"
        # still serving: the control thread lives, answers, and a normal transfer succeeds
        assert srv._thread.is_alive()
        assert receiver_answers(srv.port, ctx)
        src = tmp_path / "normal-src"
        write_file(str(src / "n.bin"), 3 * CHUNK + 1, seed=5)
        write_file(str(src / "d" / "m.txt"), 10, seed=6)
        s = run_transfer(str(src), f"127.0.0.1:{srv.port}/normal", opts(secret=SECRET))
        assert s.exit_code == 0, s.errors
        assert trees_identical(str(src), str(root / "normal"))[0]
    finally:
        srv.stop()
        ctx.term()


HOSTILE = ["../../x", "../x", "..", "/etc/x", "/tmp/x", "a/../../x", "a/..", "./a", "a/./b", "a//b", "a/", "",
           "a\x00b", "\x00", "x" * 300, "a/" + "y" * 300 + "/b", "d/" * 2100 + "f", ".amdt-0123456789abcdef01234567.part",
           "sub/" + temp_names("sub/f")[1]]
HOSTILE_TYPES = [5, None, ["a"], {"a": 1}, 1.5, True]


def _refused(fn, code=errors.FILES_FAILED):
    with pytest.raises(AutomdtError) as ei:
        fn()
    assert ei.value.code == code, ei.value.message
    return ei.value.message


def _root_entries(root):
    return sorted(os.path.relpath(os.path.join(dp, n), root) for dp, dns, fns in os.walk(root) for n in dns + fns)


@pytest.mark.parametrize("name", HOSTILE + HOSTILE_TYPES, ids=lambda n: repr(n)[:30])
def test_hostile_name_refused_everywhere_a_name_goes(env, name):
    """The same name as a file (sized and empty), a directory, the session subdir: refused."""
    for where in ("file", "empty", "dir", "subdir"):
        f = env.fake()
        try:
            if where == "subdir":
                if name in ("",) or name is None:
                    continue  # no subdir: the root itself, allowed
                _refused(lambda: f.handshake(subdir=name), code=errors.USAGE)  # a usage error, as on the sender
                continue
            f.handshake()
            if where == "dir":
                msg = _refused(lambda: f.manifest([], dirs=[name]))
            else:
                size = 0 if where == "empty" else 10
                msg = _refused(lambda: f.manifest([{"id": 0, "path": name, "size": size, "mtime_ns": 0}]))
            assert "unsafe name" in msg, msg
        finally:
            f.close()
    assert _root_entries(env.root) == []


def test_hostile_names_in_digest_requests_read_nothing(env):
    (env.root / "inside.txt").write_bytes(b"inside")
    f = env.fake()
    try:
        f.handshake()
        paths = HOSTILE + ["../outside/victim.txt", str(env.outside / "victim.txt"), "inside.txt"]
        r = f.c.request({"type": "digest", "paths": [p for p in paths if isinstance(p, str)]})
        d = r["digests"]
        assert d.pop("inside.txt") is not None
        assert set(d.values()) == {None}, {k: v for k, v in d.items() if v is not None}
    finally:
        f.close()


def _send_and_wait(f, entries, contents, dirs=()):
    plan = f.manifest(entries, dirs=dirs)
    send = [fid for fid, action in plan["files"] if action == "send"]
    acts = f.activate(send)["files"] if send else []
    ready = {fid: contents[fid] for fid, action, _ in acts if action == "send"}
    if ready:
        f.send_files(ready)
    done, errs = f.wait_done(ready, timeout=10)
    return plan, acts, done, errs


def test_nfc_nfd_twins_are_distinct_names_and_stay_inside(env):
    nfc = unicodedata.normalize("NFC", "caf\u00e9")
    nfd = unicodedata.normalize("NFD", "caf\u00e9")
    assert nfc != nfd and os.fsencode(nfc) != os.fsencode(nfd)
    entries, contents = [], {}
    for i, name in enumerate([nfc + ".txt", nfd + ".txt", nfc + "/in.bin", nfd + "/in.bin"]):
        data = os.urandom(CHUNK + 7 * i + 1)
        entries.append({"id": i, "path": name, "size": len(data), "mtime_ns": 10**18 + i, "mode": 0o644})
        contents[i] = data
    f = env.fake()
    try:
        f.handshake(subdir="twins")
        plan, acts, done, errs = _send_and_wait(f, entries, contents, dirs=[nfc, nfd])
    finally:
        f.close()
    assert errs == [] and done == set(contents), (plan, acts, errs)
    base = env.root / "twins"
    # the receiver's durability marker stays while the session that wrote is open (automdt.durable)
    names = sorted(n for n in os.listdir(base) if not n.startswith(durable.MARKER_PREFIX))
    assert len(names) == 4, names  # both spellings kept, as the bytes say (no normalisation)
    for e in entries:
        assert read(os.path.join(base, e["path"])) == contents[e["id"]]


def test_symlinks_planted_in_the_destination_are_never_followed(env):
    root, outside = env.root, env.outside
    os.symlink(outside, root / "sub")                      # a directory symlink
    os.symlink(outside / "victim.txt", root / "link.txt")  # a file symlink at a final name
    (root / "real").mkdir()
    os.symlink(outside / "dir", root / "real" / "deeper")  # deeper in the tree
    part, jname = temp_names("tmp.bin")
    os.symlink(outside / "victim.txt", root / part)        # at a partial's name
    os.symlink(outside / "dir" / "x", root / jname)        # and its journal's
    os.symlink(outside, root / "base")                     # as a session subdir
    data = {i: os.urandom(2 * CHUNK + i) for i in range(6)}
    entries = [{"id": 0, "path": "sub/x", "size": len(data[0]), "mtime_ns": 1},
               {"id": 1, "path": "link.txt", "size": len(data[1]), "mtime_ns": 1},
               {"id": 2, "path": "real/deeper/x", "size": len(data[2]), "mtime_ns": 1},
               {"id": 3, "path": "tmp.bin", "size": len(data[3]), "mtime_ns": 1},
               {"id": 4, "path": "sub/empty", "size": 0, "mtime_ns": 1},
               {"id": 5, "path": "real/ok.bin", "size": len(data[5]), "mtime_ns": 1}]
    f = env.fake()
    try:
        _refused(lambda: f.handshake(subdir="base"))
    finally:
        f.close()
    f = env.fake()
    try:
        f.handshake()
        _refused(lambda: f.manifest([], dirs=["sub/newdir"]))
    finally:
        f.close()
    f = env.fake()
    try:
        f.handshake()
        plan, acts, done, errs = _send_and_wait(f, entries, data)
        r = f.c.request({"type": "digest", "paths": ["sub/victim.txt", "link.txt", "real/deeper/x"]})
    finally:
        f.close()
    actions = dict((fid, a) for fid, a in plan["files"])
    assert actions[0] == "fail" and actions[2] == "fail" and actions[4] == "fail", plan
    # a symlink at the final name is replaced by the file (rename does not follow), never written through
    assert 1 in done and not os.path.islink(root / "link.txt") and read(root / "link.txt") == data[1]
    assert 5 in done and read(root / "real" / "ok.bin") == data[5]
    # the planted partial symlink: the file fails, or the link is removed and the file written afresh
    assert 3 not in done or read(root / "tmp.bin") == data[3]
    assert r["digests"]["sub/victim.txt"] is None and r["digests"]["real/deeper/x"] is None


def _swap_to_symlink(d, target):
    moved = d.parent / (d.name + ".moved")
    os.rename(d, moved)
    os.symlink(target, d)
    return moved


def test_directory_swapped_for_a_symlink_between_manifest_and_data(env):
    """TOCTOU: the directory the receiver created (and holds open) becomes a symlink to outside
    before the files are activated and their data sent; then again with the directory's cached
    descriptor evicted (300 more directories listed after the swap), so it must be re-opened."""
    root = env.root
    data = {i: os.urandom(CHUNK + i) for i in range(4)}
    for evict in (False, True):
        base = f"run{int(evict)}"
        f = env.fake()
        try:
            f.handshake(subdir=base)
            entries = [{"id": i, "path": f"sub/f{i}", "size": len(data[i]), "mtime_ns": 1} for i in data]
            plan = f.manifest(entries, dirs=["sub"])
            assert all(a == "send" for _, a in plan["files"]), plan
            moved = _swap_to_symlink(root / base / "sub", env.outside)
            if evict:
                f.manifest([], dirs=[f"many/d{i:03d}" for i in range(300)])
            acts = f.activate(list(data))["files"]
            ready = {fid: data[fid] for fid, a, _ in acts if a == "send"}
            if ready:
                f.send_files(ready)
            done, errs = f.wait_done(ready, timeout=10)
        finally:
            f.close()
        # contained: written into the directory it created (now moved), or refused
        for fid in done:
            assert read(moved / f"f{fid}") == data[fid]
        if evict:
            assert done == set() and all(a == "fail" for _, a, _ in acts), acts
        assert os.path.islink(root / base / "sub")


def test_directory_swapped_for_a_symlink_during_a_real_transfer(env, make_tree):
    root = env.root
    src = make_tree({f"sub/f{i:02d}.bin": 3 * CHUNK + i for i in range(30)} | {"top.bin": CHUNK})
    dst = root / "job"
    swapped = {}

    def swap():
        def started():
            d = dst / "sub"
            return d.is_dir() and any(n.endswith(".part") or not n.startswith(".") for n in os.listdir(d))
        if wait_for(started, 20, step=0.005):
            swapped["moved"] = _swap_to_symlink(dst / "sub", env.outside)

    th = threading.Thread(target=swap)
    th.start()
    s = run_transfer(src, f"127.0.0.1:{env.srv.port}/job", opts(secret=SECRET, throttle={"net": (0, 3e6)}, window_files=4))
    th.join(30)
    assert "moved" in swapped, "the swap came too late"
    assert s.exit_code in (0, errors.FILES_FAILED), s.errors
    assert os.path.islink(dst / "sub")
    moved = swapped["moved"]
    for n in os.listdir(moved):
        if not n.startswith(".amdt-"):
            assert read(moved / n) == read(os.path.join(src, "sub", n))
    assert read(dst / "top.bin") == read(os.path.join(src, "top.bin"))


def test_file_and_directory_collisions_are_refused(env):
    root = env.root
    (root / "adir").mkdir()
    (root / "afile").write_bytes(b"keep")
    f = env.fake()
    try:
        f.handshake()
        plan = f.manifest([{"id": 0, "path": "adir", "size": 5, "mtime_ns": 1},
                           {"id": 1, "path": "afile/x", "size": 5, "mtime_ns": 1}])
    finally:
        f.close()
    assert dict((i, a) for i, a in plan["files"]) == {0: "fail", 1: "fail"}
    assert (root / "adir").is_dir() and read(root / "afile") == b"keep"


def test_hard_link_planted_at_a_partial_is_never_written_through(env, make_tree):
    import struct

    import xxhash

    from automdt import journal

    src = make_tree({"data.bin": 8 * CHUNK})
    dest = f"127.0.0.1:{env.srv.port}/job"
    s = run_transfer(src, dest, opts(secret=SECRET, throttle={"net": (0, 1e6)}, max_duration_s=0.4))
    assert s.exit_code == errors.MAX_DURATION, s.errors
    part, jname = temp_names("data.bin")
    pp, jp = env.root / "job" / part, env.root / "job" / jname
    header = read(jp)[:journal.HEADER_SIZE]  # the legitimate fingerprint, copied
    victim = env.outside / "big.bin"
    vdata = read(victim)
    os.unlink(pp)
    os.link(victim, pp)
    recs = b""
    for i in range(4):  # the first half "already written": records that match the victim's data
        r = struct.pack("<4sIQQ", b"AMJR", CHUNK, i * CHUNK, xxhash.xxh3_64_intdigest(vdata[i * CHUNK:(i + 1) * CHUNK]))
        recs += r + struct.pack("<Q", xxhash.xxh3_64_intdigest(r))
    with open(jp, "wb") as f:
        f.write(header + recs)
    vst = os.stat(victim)
    try:
        s = run_transfer(src, dest, opts(secret=SECRET))
        assert read(victim) == vdata and os.stat(victim).st_mode & 0o777 == 0o600, "the outside file was written through"
        assert s.exit_code == 0, s.errors
        assert read(env.root / "job" / "data.bin") == read(os.path.join(src, "data.bin"))
    finally:  # undo the damage so the fixture's guard reports only what this test asserts
        os.unlink(victim)
        victim.write_bytes(vdata)
        os.chmod(victim, 0o600)
        os.utime(victim, ns=(vst.st_atime_ns, vst.st_mtime_ns))
