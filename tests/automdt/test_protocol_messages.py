"""The typed control messages (automdt.protocol) against the wire objects the untyped code built.

Each ``OLD_*`` literal is what sender.py / receiver.py sent before the messages had classes
(the dicts as they were written there, keys in the same order); the typed classes must encode
to the very same bytes and read them back unchanged, so senders and receivers of either kind
keep talking to each other."""
import errno

import pytest

from automdt import errors, protocol
from automdt.protocol import encode

CN, SN, MAC = "c" * 64, "s" * 64, "m" * 64

# (typed message, the dict the untyped code sent) -- requests from sender.py
REQUESTS = [
    (protocol.Hello(protocol.VERSION, CN), {"type": "hello", "version": protocol.VERSION, "nonce": CN}),
    (protocol.Auth(MAC), {"type": "auth", "mac": MAC}),
    (protocol.Auth(), {"type": "auth"}),
    (protocol.Open(subdir="a/b", chunk_size=1 << 20, memory=64 << 20, write_threads=3, checksum=True, fsync="dir",
                   write_throttle=(1000, 0), dry_run=False, encrypt=True, scratch=False),
     {"type": "open", "subdir": "a/b", "chunk_size": 1 << 20, "memory": 64 << 20, "write_threads": 3, "checksum": True,
      "fsync": "dir", "write_throttle": [1000, 0], "dry_run": False, "encrypt": True}),
    (protocol.Open(subdir=".automdt-explore-scratch-1", chunk_size=4 << 20, memory=1 << 20, write_threads=1,
                   write_throttle=(0.0, 5e8), scratch=True),
     {"type": "open", "subdir": ".automdt-explore-scratch-1", "chunk_size": 4 << 20, "memory": 1 << 20,
      "write_threads": 1, "checksum": False, "fsync": "none", "write_throttle": [0.0, 5e8], "dry_run": False,
      "encrypt": False, "scratch": True}),
    (protocol.Manifest([], ["d", "d/e"]), {"type": "manifest", "files": [], "dirs": ["d", "d/e"]}),
    (protocol.Manifest([protocol.ManifestEntry(0, "d/f", 10, 123, 0o640, "1:2"),
                        protocol.ManifestEntry(1, "g", 0, 5, 0o644, "1:3", "ab" * 16)], []),
     {"type": "manifest", "files": [{"id": 0, "path": "d/f", "size": 10, "mtime_ns": 123, "mode": 0o640, "source_id": "1:2"},
                                    {"id": 1, "path": "g", "size": 0, "mtime_ns": 5, "mode": 0o644, "source_id": "1:3",
                                     "digest": "ab" * 16}], "dirs": []}),
    (protocol.Activate([3, 1, 2]), {"type": "activate", "ids": [3, 1, 2]}),
    (protocol.Poll(), {"type": "poll"}),
    (protocol.Poll(write_threads=7), {"type": "poll", "write_threads": 7}),
    (protocol.Poll(write_threads=2, write_throttle=(10, 20)), {"type": "poll", "write_threads": 2, "write_throttle": [10, 20]}),
    (protocol.Poll(write_throttle=(0, 0)), {"type": "poll", "write_throttle": [0, 0]}),
    (protocol.Missing([4]), {"type": "missing", "ids": [4]}),
    (protocol.Fail([5]), {"type": "fail", "ids": [5]}),
    (protocol.Fail([5], discard=True), {"type": "fail", "ids": [5], "discard": True}),
    (protocol.Digest(["a", "b/c"]), {"type": "digest", "paths": ["a", "b/c"]}),
    (protocol.Close(), {"type": "close"}),
]

# replies from receiver.py
REPLIES = [
    (protocol.Challenge(SN, True), {"type": "challenge", "nonce": SN, "auth": True}),
    (protocol.Welcome(mac=MAC), {"type": "welcome", "mac": MAC}),
    (protocol.Welcome(token="ab" * 32), {"type": "welcome", "token": "ab" * 32}),
    (protocol.Opened(40000, 1 << 20, 64 << 20, 64, False, runtime_throttle=True),
     {"type": "opened", "data_port": 40000, "chunk_size": 1 << 20, "memory": 64 << 20, "max_threads": 64,
      "encrypted": False, "runtime_throttle": True}),
    (protocol.Opened(40000, 1 << 20, 64 << 20, 64, False, runtime_throttle=True, share=[16, 64]),
     {"type": "opened", "data_port": 40000, "chunk_size": 1 << 20, "memory": 64 << 20, "max_threads": 64,
      "encrypted": False, "runtime_throttle": True, "share": [16, 64]}),
    (protocol.Plan([(0, "skip"), (1, "send"), (2, "done"), (3, "fail")]),
     {"type": "plan", "files": [[0, "skip"], [1, "send"], [2, "done"], [3, "fail"]]}),
    (protocol.Activated([(1, "send", [[0, 10], [30, 5]]), (2, "done", []), (3, "fail", [])]),
     {"type": "activated", "files": [[1, "send", [[0, 10], [30, 5]]], [2, "done", []], [3, "fail", []]]}),
    (protocol.Status({"write": {"bytes": 5}}, [1], [[2, 0, 4096]], [[3, 6, "x: denied"]], None, 12.5),
     {"type": "status", "stats": {"write": {"bytes": 5}}, "done": [1], "bad": [[2, 0, 4096]],
      "errors": [[3, 6, "x: denied"]], "fatal": None, "now": 12.5}),
    (protocol.Status({}, [], [], [], [7, "f: No space left on device"], 1.0),
     {"type": "status", "stats": {}, "done": [], "bad": [], "errors": [], "fatal": [7, "f: No space left on device"],
      "now": 1.0}),
    (protocol.Status({}, [], [], [], None, 2.0, [8, 32]),
     {"type": "status", "stats": {}, "done": [], "bad": [], "errors": [], "fatal": None, "now": 2.0,
      "share": [8, 32]}),
    (protocol.MissingRanges({"4": [[0, 4096]]}), {"type": "missing", "files": {"4": [[0, 4096]]}}),
    (protocol.Ok(), {"type": "ok"}),
    (protocol.Digests({"a": "ff", "b": None}, {"b": "permission denied"}),
     {"type": "digests", "digests": {"a": "ff", "b": None}, "unreadable": {"b": "permission denied"}}),
    (protocol.Closed(), {"type": "closed"}),
    (protocol.Error(errors.USAGE, "repeated hello"), {"type": "error", "code": errors.USAGE, "message": "repeated hello"}),
]


@pytest.mark.parametrize("typed,old", REQUESTS + REPLIES, ids=lambda x: getattr(x, "TYPE", ""))
def test_same_bytes_as_the_untyped_code(typed, old):
    assert typed.encode() == encode(old)


@pytest.mark.parametrize("typed,old", REQUESTS + REPLIES, ids=lambda x: getattr(x, "TYPE", ""))
def test_reads_what_the_untyped_code_sent(typed, old):
    back = type(typed).from_dict(protocol.decode(encode(dict(old, seq=9))))
    if isinstance(back, protocol.Open):  # the receiver reads limits as whole bytes per second
        assert back.write_throttle == tuple(int(x) for x in old["write_throttle"])
        back.write_throttle = typed.write_throttle
    assert back.encode() == encode(old)


def test_requests_know_their_replies():
    assert set(protocol.REQUESTS) == {"hello", "auth", "open", "manifest", "activate", "poll", "missing", "fail",
                                      "digest", "close"}
    assert protocol.REQUESTS["poll"].REPLY is protocol.Status
    assert protocol.REQUESTS["missing"].REPLY.TYPE == "missing"


def test_open_reads_leniently_as_the_receiver_always_did():
    o = protocol.Open.from_dict({"type": "open"})
    assert (o.subdir, o.chunk_size, o.memory, o.write_threads, o.fsync, o.write_throttle) == ("", 4 << 20, None, 1, "none", (0, 0))
    assert protocol.Open.from_dict({"type": "open", "fsync": "sometimes", "encrypt": 1, "scratch": "yes"}).fsync == "none"
    assert protocol.Open.from_dict({"type": "open", "encrypt": 1}).encrypt is False  # only a JSON true counts
    with pytest.raises(ValueError):
        protocol.Open.from_dict({"type": "open", "chunk_size": "big"})
    with pytest.raises(IndexError):
        protocol.Open.from_dict({"type": "open", "write_throttle": [5]})


def test_manifest_entries_are_read_one_by_one():
    m = protocol.Manifest.from_dict({"type": "manifest", "files": [{"id": 0}, "junk"]})
    assert m.files == [{"id": 0}, "junk"] and m.dirs == []
    with pytest.raises(KeyError):
        protocol.ManifestEntry.from_dict(m.files[0])
    e = protocol.ManifestEntry.from_dict({"id": "3", "path": "p", "size": 1, "mtime_ns": 2, "source_id": "x" * 100, "digest": 5})
    assert (e.id, e.mode, len(e.source_id), e.digest) == (3, 0o644, 64, None)


def test_poll_and_digest_bounds():
    assert protocol.Poll.from_dict({"type": "poll", "write_threads": None}).write_threads is None
    with pytest.raises(ValueError):
        protocol.Poll.from_dict({"type": "poll", "write_throttle": [1, 2, 3]})
    assert len(protocol.Digest.from_dict({"type": "digest", "paths": ["p"] * 5000}).paths) == protocol.MAX_DIGEST_PATHS


@pytest.mark.parametrize("err,default,source,want", [
    (errno.ENOSPC, errors.FILES_FAILED, False, errors.FATAL),
    (errno.EDQUOT, errors.ERROR, False, errors.FATAL),
    (errno.EACCES, errors.FILES_FAILED, False, errors.FILES_FAILED),
    (errno.EIO, errors.ERROR, False, errors.ERROR),
    (0, errors.FILES_FAILED, True, errors.SOURCE_CHANGED),
    (errno.ENOENT, errors.FILES_FAILED, True, errors.SOURCE_CHANGED),
    (errno.ESTALE, errors.FILES_FAILED, True, errors.SOURCE_CHANGED),
    (errno.EACCES, errors.FILES_FAILED, True, errors.FILES_FAILED),
    (errno.ENOSPC, errors.FILES_FAILED, True, errors.FILES_FAILED),
])
def test_from_oserror(err, default, source, want):
    assert errors.from_oserror(err, default, source=source) == want
    assert errors.from_oserror(OSError(err, "x"), default, source=source) == want


def test_a_destination_gone_read_only_mid_transfer_is_fatal_but_not_at_open():
    assert errors.from_oserror(errno.EROFS, errors.FILES_FAILED, writing=True) == errors.FATAL
    assert errors.from_oserror(errno.EROFS, errors.DIR_NOT_FOUND) == errors.DIR_NOT_FOUND
    assert errors.from_oserror(errno.EIO, errors.FILES_FAILED, writing=True) == errors.FILES_FAILED


def test_from_oserror_without_errno():
    assert errors.from_oserror(OSError("no errno"), source=True) == errors.FILES_FAILED


@pytest.mark.parametrize("wire", [None, [], [8], [8, 32, 1], ["x", 2], [0, 4], [4, -1], "8,32", {"a": 1}])
def test_a_malformed_share_is_ignored_not_obeyed(wire):
    """A sender keeps its own bounds when a receiver's share is missing or makes no sense (never a
    zero or negative thread count from the wire)."""
    d = {"type": "status", "stats": {}, "now": 1.0}
    if wire is not None:
        d["share"] = wire
    assert protocol.Status.from_dict(d).share is None
