"""Coverage-guided fuzzing (atheris, libFuzzer) of the receiver's two inputs from the network.

Run as a libFuzzer target by ``scripts/fuzz_receiver.py`` (which prints the figures):

    python -m tests.fuzz.harness control|data STATS.json [CORPUS_DIR] [libFuzzer flags, e.g. -runs=1000000]

* ``control``: every input becomes one or more control messages handed to a real
  :class:`automdt.receiver.ReceiverServer` exactly as its serve loop hands a received frame
  (``_dispatch``): raw bytes, or JSON built from the input (known and unknown types, every field
  with values of every JSON type, manifests of hostile names), to a fresh peer (before the
  handshake) or to an authenticated open session.
* ``data``: every input becomes one data connection to that session's engine (the C frame
  parser): a hello with a valid or fuzzed token, then frames whose header fields are each valid
  or drawn from the input, payloads of the right, wrong or truncated length, or raw bytes; the
  connection is half-closed and must be closed by the receiver within 10 s (a hang fails).

The receiver's code (automdt.receiver, session, partial, protocol, paths, journal) is
instrumented by atheris, so libFuzzer's ``cov``/``ft`` figures are edges and features of that
Python code, which steer the
mutations; the C engine is not instrumented (gcc), its outcomes are counted by reason from its
counters instead. After every input: the session is still usable (or re-created after it was
legitimately dropped) and no internal error was logged; every 2000 inputs and at the end:
nothing changed outside the destination root (a canary tree beside it) and a complete normal
transfer (handshake, manifest, data connection, rename, content check) still succeeds.
Any failure raises, which libFuzzer reports as a crash (input saved, non-zero exit).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import struct
import sys
import tempfile
import time

import atheris


def _preload_engine() -> None:
    """``AMDT_FUZZ_ENGINE=/path/_engine.so``: use that build of the C engine (e.g. the gcov-
    instrumented one of ``scripts/fuzz_receiver.py --c-coverage``) instead of the installed one."""
    path = os.environ.get("AMDT_FUZZ_ENGINE")
    if path:
        import importlib.util

        spec = importlib.util.spec_from_file_location("automdt.transfer_engine._engine", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)


_preload_engine()
with atheris.instrument_imports(include=["automdt"]):
    from automdt import protocol
    from automdt.receiver import ReceiverServer

from automdt.transfer_engine import frame_hash

SECRET = b"amdt-i14-fuzz-secret"
CHUNK = 4096
FRAME = struct.Struct("<IIQIIQ")
FRAME_MAGIC = 0x43444D41
TYPES = ["hello", "auth", "open", "manifest", "activate", "poll", "missing", "fail", "digest", "close"]
FIELDS = ["type", "seq", "version", "nonce", "mac", "subdir", "chunk_size", "memory", "write_threads", "checksum",
          "fsync", "dry_run", "encrypt", "write_throttle", "rcvbuf", "files", "dirs", "ids", "paths", "id", "path",
          "size", "mtime_ns", "mode", "digest", "source_id"]
NAMES = ["a", "..", ".", "", "/", "/etc/passwd", "../../x", "a/../../b", "a//b", "a\0b", "x" * 256, "é", "e\u0301",
         ".amdt-x.part", "sub/", "./a", "a/./b", "\\..\\x", "CON", "a" * 5000, "d/e/f", "-rf"]


class Finding(AssertionError):
    """A property the fuzzer must never break."""


class _Errors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records = []

    def emit(self, record):
        if "internal error" in record.getMessage() or record.exc_info:
            self.records.append(record.getMessage())


class Harness:
    def __init__(self, target: str, stats_path: str, runs: int):
        self.target, self.stats_path, self.runs = target, stats_path, runs
        self.work = tempfile.mkdtemp(prefix=f"amdt-i14-fuzz-{target}-")
        self.root = os.path.join(self.work, "root")
        os.makedirs(self.root)
        os.makedirs(os.path.join(self.work, "outside", "deep"))
        with open(os.path.join(self.work, "outside", "canary"), "wb") as f:
            f.write(b"must stay")
        self.outside_before = self._outside()
        self.errors = _Errors()
        logging.getLogger("automdt").addHandler(self.errors)
        logging.getLogger("automdt").setLevel(logging.ERROR)
        self.srv = ReceiverServer(self.root, "127.0.0.1", 0, secret=SECRET, idle_timeout_s=3600, max_sessions=1000)
        self.srv.max_pending = 8
        self.count = 0
        self.idents = 0
        self.resets = 0
        self.normal_ok = 0
        self.outcomes = {}
        self.t0 = time.monotonic()
        self.sess = None
        self.new_session()

    # ----------------------------------------------------------------------- sessions
    def ident(self) -> bytes:
        self.idents += 1
        return b"fz%d" % self.idents

    def call(self, ident: bytes, msg) -> None:
        self.srv._dispatch(ident, msg if isinstance(msg, bytes) else protocol.encode(msg))

    def open_session(self, subdir: str = "fz"):
        ident = self.ident()
        cn = protocol.nonce()
        self.call(ident, {"type": "hello", "version": protocol.VERSION, "nonce": cn, "seq": 1})
        s = self.srv.sessions[ident]
        self.call(ident, {"type": "auth", "mac": protocol.mac(SECRET, "client", s.server_nonce, cn), "seq": 2})
        self.call(ident, {"type": "open", "subdir": subdir, "chunk_size": CHUNK, "memory": 256 << 10,
                          "write_threads": 1, "seq": 3})
        if s.state != "open":
            raise Finding(f"a valid handshake did not open a session (state {s.state})")
        return ident, s

    def new_session(self) -> None:
        if self.sess is not None:
            self.srv._drop(self.sess[0])
        self.resets += 1
        self.sess = self.open_session()
        self.file_gen = 0
        if self.target == "data":
            self.register_files()

    def register_files(self) -> None:
        ident, s = self.sess
        self.file_gen += 1
        base = 10 * self.file_gen
        self.sizes = {base: 3 * CHUNK + 5, base + 1: CHUNK}
        self.call(ident, {"type": "manifest", "seq": 4, "dirs": [], "files": [
            {"id": fid, "path": f"g{self.file_gen}/f{fid}", "size": n, "mtime_ns": 10**18}
            for fid, n in self.sizes.items()]})
        self.call(ident, {"type": "activate", "ids": list(self.sizes), "seq": 5})
        if not all(fid in s.files and s.files[fid].active for fid in self.sizes):
            raise Finding("registering files on a fresh session failed")

    def alive_session(self):
        """The persistent session, re-created if a (legitimate) error dropped it."""
        ident, s = self.sess
        if self.srv.sessions.get(ident) is not s or s.state != "open":
            self.new_session()
        return self.sess

    # ------------------------------------------------------------------------- checks
    def _outside(self):
        out = {}
        for dp, dns, fns in os.walk(self.work):
            if os.path.abspath(dp) == os.path.abspath(self.root):
                dns[:] = []
                continue
            dns[:] = [d for d in dns if os.path.join(dp, d) != self.root]
            for n in dns + fns:
                p = os.path.join(dp, n)
                if p == self.root or p == self.stats_path:
                    continue
                st = os.lstat(p)
                data = b""
                if os.path.isfile(p) and not os.path.islink(p):
                    with open(p, "rb") as f:
                        data = f.read()
                out[os.path.relpath(p, self.work)] = (st.st_mode, st.st_size, hashlib.sha256(data).hexdigest())
        return out

    def check_outside(self) -> None:
        now = self._outside()
        if now != self.outside_before:
            raise Finding(f"something changed outside the destination root: {sorted(set(now) ^ set(self.outside_before))[:5]}")

    def check_normal_transfer(self) -> None:
        """A complete, ordinary transfer through the same server: handshake, manifest, frames, rename."""
        ident, s = self.open_session(subdir=f"normal{self.normal_ok}")
        data = {0: os.urandom(2 * CHUNK + 7), 1: os.urandom(5)}
        self.call(ident, {"type": "manifest", "seq": 6, "dirs": ["n"], "files": [
            {"id": fid, "path": f"n/f{fid}", "size": len(d), "mtime_ns": 10**18} for fid, d in data.items()]})
        self.call(ident, {"type": "activate", "ids": [0, 1], "seq": 7})
        with socket.create_connection(("127.0.0.1", s.engine.port), timeout=10) as c:
            c.sendall(b"AMDTDATA" + s.token + b"".join(_frames(fid, d) for fid, d in data.items()))
            c.shutdown(socket.SHUT_WR)
            c.recv(1)
        deadline = time.monotonic() + 20
        while len(s.done) < 2 and time.monotonic() < deadline:
            s.pump()
            time.sleep(0.005)
        for fid, d in data.items():
            with open(os.path.join(self.root, f"normal{self.normal_ok}", "n", f"f{fid}"), "rb") as f:
                if f.read() != d:
                    raise Finding("a normal transfer after fuzzing did not complete identically")
        self.srv._drop(ident)
        self.normal_ok += 1

    def checkpoint(self, final: bool = False) -> None:
        self.check_outside()
        self.check_normal_transfer()
        if not final and self.count % 20000 == 0:  # keep the destination small: start afresh
            self.srv._drop(self.sess[0])
            self.sess = None
            for n in os.listdir(self.root):
                p = os.path.join(self.root, n)
                shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
            self.new_session()
        self.write_stats(final)

    def write_stats(self, final: bool) -> None:
        st = {"target": self.target, "inputs": self.count, "seconds": round(time.monotonic() - self.t0, 1),
              "session_resets": self.resets, "normal_transfers_ok": self.normal_ok, "outcomes": self.outcomes,
              "final": final}
        tmp = self.stats_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(st, f)
        os.replace(tmp, self.stats_path)

    # -------------------------------------------------------------------------- inputs
    def one(self, data: bytes) -> None:
        self.count += 1
        fdp = atheris.FuzzedDataProvider(data)
        if self.target == "control":
            self.control(fdp)
        else:
            self.data(fdp)
        if self.errors.records:
            raise Finding(f"internal error logged: {self.errors.records[:2]}")
        if self.count % 2000 == 0 or self.count == self.runs:
            self.checkpoint(final=self.count == self.runs)
            if self.count == self.runs:
                self.close()

    def close(self) -> None:
        self.srv._shutdown()
        shutil.rmtree(self.work, ignore_errors=True)

    def control(self, fdp) -> None:
        mode = fdp.ConsumeIntInRange(0, 4)
        self.outcomes[f"mode{mode}"] = self.outcomes.get(f"mode{mode}", 0) + 1
        if mode == 0:  # raw bytes from a stranger
            ident = self.ident()
            self.call(ident, fdp.ConsumeBytes(fdp.remaining_bytes()))
            self.srv._drop(ident)
        elif mode == 1:  # a stranger walking the handshake with fuzzed fields
            ident = self.ident()
            for _ in range(fdp.ConsumeIntInRange(1, 4)):
                self.call(ident, self.message(fdp, pre_auth=True))
            self.srv._drop(ident)
        else:
            ident, s = self.alive_session()
            # (an exhausted input reads as 0; the count caps the engine restarts this path costs)
            real = fdp.ConsumeIntInRange(0, 511) == 511 and self.count % 16 == 0
            for _ in range(fdp.ConsumeIntInRange(1, 3)):
                msg = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 512)) if mode == 4 else self.message(fdp)
                if real:  # the serve loop's own path: an error drops the session (re-created next time)
                    self.call(ident, msg)
                    if self.srv.sessions.get(ident) is not s:
                        self.outcomes["dropped"] = self.outcomes.get("dropped", 0) + 1
                        break
                else:
                    self.handle(s, msg)
                s.pump()
            if len(s.files) > 5000:
                self.new_session()

    def handle(self, s, msg) -> None:
        """What ``_dispatch`` does with a message for an existing session, except dropping the
        session after an error: the same session keeps taking inputs (a superset of the states a
        real peer reaches, and no engine restart per input). An exception ``_dispatch`` would
        only catch in its last-resort branch (an internal error) is a finding."""
        from automdt.errors import AutomdtError
        from automdt.receiver import SessionError

        try:
            s.handle(protocol.decode(msg if isinstance(msg, bytes) else protocol.encode(msg)))
        except (protocol.ProtocolError, SessionError, AutomdtError, OSError) as e:
            key = type(e).__name__
            self.outcomes[key] = self.outcomes.get(key, 0) + 1
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, RecursionError) as e:
            key = "bad request " + type(e).__name__  # _dispatch answers "bad request" and drops the peer
            self.outcomes[key] = self.outcomes.get(key, 0) + 1
        if s.state != "open":  # closed (a 'close' message) or never open: start a fresh one
            self.new_session()

    def message(self, fdp, pre_auth: bool = False):
        # 'close' ends the persistent session (a new one costs an engine start); the serve loop's
        # own path (1 in 512 inputs) and raw bytes still reach it
        kinds = TYPES[:2] if pre_auth else TYPES[:-1]
        t = fdp.PickValueInList(kinds + ["", "x" * 3, "HELLO"]) if fdp.ConsumeBool() else fdp.ConsumeUnicode(8)
        msg = {"type": t, "seq": fdp.ConsumeIntInRange(0, 1 << 40)}
        if t == "manifest" and fdp.ConsumeBool():
            msg["files"] = [{"id": self.value_or(fdp, fdp.ConsumeIntInRange(0, 1 << 33)),
                             "path": self.value_or(fdp, self.name(fdp)),
                             "size": self.value_or(fdp, fdp.ConsumeIntInRange(0, 1 << 20)),
                             "mtime_ns": self.value_or(fdp, fdp.ConsumeInt(8)),
                             "mode": fdp.ConsumeIntInRange(0, 0o7777)}
                            for _ in range(fdp.ConsumeIntInRange(0, 4))]
            msg["dirs"] = [self.name(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))]
        elif t == "hello" and fdp.ConsumeBool():
            msg.update(version=self.value_or(fdp, protocol.VERSION), nonce=self.value_or(fdp, protocol.nonce()))
        for _ in range(fdp.ConsumeIntInRange(0, 4)):
            msg[fdp.PickValueInList(FIELDS) if fdp.ConsumeBool() else fdp.ConsumeUnicode(6)] = self.value(fdp, 2)
        return msg

    def name(self, fdp) -> str:
        if fdp.ConsumeBool():
            return "/".join(fdp.PickValueInList(NAMES) for _ in range(fdp.ConsumeIntInRange(1, 3)))
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 40))

    def value_or(self, fdp, good):
        return good if fdp.ConsumeIntInRange(0, 3) else self.value(fdp, 1)

    def value(self, fdp, depth: int):
        k = fdp.ConsumeIntInRange(0, 8 if depth > 0 else 6)
        if k == 0:
            return None
        if k == 1:
            return fdp.ConsumeBool()
        if k == 2:
            return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 9))
        if k == 3:
            return fdp.ConsumeRegularFloat()
        if k == 4:
            return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 64))
        if k == 5:
            return fdp.PickValueInList(NAMES)
        if k == 6:
            return fdp.ConsumeIntInRange(-(1 << 70), 1 << 70)
        if k == 7:
            return [self.value(fdp, depth - 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
        return {fdp.ConsumeUnicode(4): self.value(fdp, depth - 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}

    def tls_session(self):
        """A second open session that requires TLS on its data connections (``encrypt``)."""
        t = getattr(self, "tls", None)
        if t is None or self.srv.sessions.get(t[0]) is not t[1] or t[1].state != "open":
            ident = self.ident()
            cn = protocol.nonce()
            self.call(ident, {"type": "hello", "version": protocol.VERSION, "nonce": cn, "seq": 1})
            s = self.srv.sessions[ident]
            self.call(ident, {"type": "auth", "mac": protocol.mac(SECRET, "client", s.server_nonce, cn), "seq": 2})
            self.call(ident, {"type": "open", "subdir": "tls", "chunk_size": CHUNK, "memory": 256 << 10,
                              "write_threads": 1, "encrypt": True, "seq": 3})
            if s.state != "open":
                raise Finding("a valid encrypted handshake did not open a session")
            self.tls = t = (ident, s)
        return t

    def data(self, fdp) -> None:
        if fdp.ConsumeIntInRange(0, 15) == 15:  # garbage where a TLS ClientHello belongs
            ident, s = self.tls_session()
            self.connection(s, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 2048)), tls=True)
            return
        ident, s = self.alive_session()
        token = s.token if fdp.ConsumeIntInRange(0, 15) else fdp.ConsumeBytes(32).ljust(32, b"\0")
        magic = b"AMDTDATA" if fdp.ConsumeIntInRange(0, 15) else fdp.ConsumeBytes(8).ljust(8, b"\0")
        body = bytearray()
        ids = list(self.sizes)
        for _ in range(fdp.ConsumeIntInRange(0, 4)):
            fid = fdp.PickValueInList(ids) if fdp.ConsumeIntInRange(0, 7) else fdp.ConsumeIntInRange(0, 2**32 - 1)
            size = self.sizes.get(fid, CHUNK)
            nch = -(-size // CHUNK)
            off = fdp.ConsumeIntInRange(0, nch - 1) * CHUNK if fdp.ConsumeIntInRange(0, 7) else fdp.ConsumeInt(8) % 2**64
            want = max(0, min(CHUNK, size - off)) if off < size else 0
            ln = want if fdp.ConsumeIntInRange(0, 7) else fdp.ConsumeIntInRange(0, 2 * CHUNK)
            payload = fdp.ConsumeBytes(min(ln, 2 * CHUNK)) if fdp.ConsumeBool() else os.urandom(min(ln, 2 * CHUNK))
            if fdp.ConsumeIntInRange(0, 7) == 0:
                payload = payload[:fdp.ConsumeIntInRange(0, len(payload))]  # truncated: EOF inside the frame
            h = frame_hash(payload, fid, off) if fdp.ConsumeIntInRange(0, 3) else fdp.ConsumeInt(8) % 2**64
            mg = FRAME_MAGIC if fdp.ConsumeIntInRange(0, 15) else fdp.ConsumeInt(4) % 2**32
            flags = 0 if fdp.ConsumeIntInRange(0, 15) else fdp.ConsumeInt(4) % 2**32
            body += FRAME.pack(mg, fid % 2**32, off, ln % 2**32, flags, h) + payload
        if fdp.ConsumeIntInRange(0, 3) == 0:
            body += fdp.ConsumeBytes(fdp.remaining_bytes())
        stream = magic + token + bytes(body)
        if fdp.ConsumeIntInRange(0, 7) == 7:  # cut anywhere: in the hello, a header or a payload
            stream = stream[:fdp.ConsumeIntInRange(0, len(stream))]
        self.connection(s, stream)
        if s.done or not all(fid in s.files for fid in self.sizes):
            s.done.clear()
            self.register_files()  # completed (renamed) files: fresh ones to aim at

    def connection(self, s, stream: bytes, tls: bool = False) -> None:
        """One data connection carrying ``stream``, half-closed; the receiver must close it
        within 10 s, and never answer a plain one (a TLS server may: its handshake, an alert)."""
        before = s.engine.stats()
        c = socket.create_connection(("127.0.0.1", s.engine.port), timeout=10)
        try:
            c.sendall(stream)
            c.shutdown(socket.SHUT_WR)
            try:
                deadline = time.monotonic() + 10
                while tls and c.recv(65536) != b"":
                    if time.monotonic() > deadline:
                        raise socket.timeout
                if not tls and c.recv(1) != b"":
                    raise Finding("the receiver answered on a data connection")
            except socket.timeout:
                raise Finding("the receiver did not close a finished data connection within 10 s") from None
            except ConnectionResetError:
                pass
        except (BrokenPipeError, ConnectionResetError, OSError) as e:
            if isinstance(e, Finding) or isinstance(e, socket.timeout):
                raise
            # it closed early (rejected hello or frame) while we were still sending
        finally:
            c.close()
        s.pump()
        after = s.engine.stats()
        for name in ("connections_rejected", "protocol_errors", "chunks_bad", "chunks_written", "chunks_duplicate"):
            d = getattr(after, name) - getattr(before, name)
            if d:
                self.outcomes[name] = self.outcomes.get(name, 0) + d


def _frames(fid: int, data: bytes) -> bytes:
    out = bytearray()
    for off in range(0, len(data), CHUNK):
        c = data[off:off + CHUNK]
        out += FRAME.pack(FRAME_MAGIC, fid, off, len(c), 0, frame_hash(c, fid, off)) + c
    return bytes(out)


def main() -> None:
    target, stats = sys.argv[1], sys.argv[2]
    flags = sys.argv[3:]  # libFuzzer's: a corpus directory, -runs=N, -max_len=N, -timeout=S ...
    runs = next((int(f.split("=", 1)[1]) for f in flags if f.startswith("-runs=")), 0)
    h = Harness(target, os.path.abspath(stats), runs)
    atheris.Setup([sys.argv[0]] + flags, h.one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
