"""Shared pieces of the fault-injection suite: invariants, journal analysis, processes, a fake sender."""
from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from typing import Dict, Iterable, List, Optional, Tuple

import xxhash

from automdt.transfer_engine import frame_hash

from automdt import journal, protocol
from automdt.paths import TEMP_PREFIX, temp_names
from automdt.sender import TransferOptions
from tests.util import CHUNK

PY = sys.executable
FRAME = struct.Struct("<IIQIIQ")
FRAME_MAGIC = 0x43444D41


def opts(**kw) -> TransferOptions:
    base = dict(threads=(2, 3, 2), memory=1 << 20, chunk_size=CHUNK, interval_s=0.2, timeout_s=20, stall_s=30)
    base.update(kw)
    return TransferOptions(**base)


# ----------------------------------------------------------------------------- invariants
def snapshot(top: str, exclude: Iterable[str] = ()) -> Dict[str, tuple]:
    """Everything under ``top`` (not following symlinks) except the ``exclude`` subtrees:
    relpath -> (kind, size, mtime_ns, sha256 of content or link target)."""
    ex = [os.path.abspath(e) for e in exclude]
    out: Dict[str, tuple] = {}
    for dp, dns, fns in os.walk(top):
        dns[:] = [d for d in dns if os.path.join(dp, d) not in ex]
        for name in dns + fns:
            p = os.path.join(dp, name)
            if p in ex:
                continue
            st = os.lstat(p)
            rel = os.path.relpath(p, top)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_mode & 0o7777)
            else:
                with open(p, "rb") as f:
                    h = hashlib.sha256(f.read()).hexdigest()
                out[rel] = ("file", st.st_size, st.st_mtime_ns, st.st_mode & 0o7777, h)
    return out


class Outside:
    """Guards everything outside a destination root: snapshot before, compare after."""

    def __init__(self, top: str, roots: Iterable[str], allow_new: Iterable[str] = ()):
        """``allow_new``: top-level names under ``top`` where the test itself creates entries later."""
        self.top = str(top)
        self.roots = [str(r) for r in roots]
        self.allow_new = tuple(allow_new)
        self.before = snapshot(self.top, self.roots)

    def check(self) -> None:
        after = snapshot(self.top, self.roots)
        changed = sorted(k for k in set(self.before) | set(after) if self.before.get(k) != after.get(k)
                         and not (k not in self.before and k.split(os.sep)[0].startswith(self.allow_new)))
        assert not changed, f"touched outside the destination root: {changed[:20]}"


def final_files(dst: str) -> Dict[str, str]:
    """relpath -> abspath of every entry under a final name (not AutoMDT's temporaries)."""
    out = {}
    for dp, dns, fns in os.walk(dst):
        for n in fns + [d for d in dns if os.path.islink(os.path.join(dp, d))]:
            if n.startswith(TEMP_PREFIX):
                continue
            p = os.path.join(dp, n)
            out[os.path.relpath(p, dst)] = p
    return out


def temporaries(dst: str) -> List[str]:
    return sorted(os.path.relpath(os.path.join(dp, n), dst) for dp, _, fns in os.walk(dst)
                  for n in fns if n.startswith(TEMP_PREFIX))


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def assert_final_names_ok(dst: str, versions: Dict[str, Iterable[bytes]], allow_extra: Iterable[str] = (),
                          planted_links: Iterable[str] = ()) -> Dict[str, str]:
    """Nothing under a final name is wrong: every final file is a regular file whose content is
    one of the allowed versions of its source (never a mix), and no symlink was created."""
    extra = set(allow_extra)
    links = set(planted_links)
    finals = final_files(dst)
    for rel, p in finals.items():
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            assert rel in links, f"{rel}: a symlink appeared on the destination"
            continue
        assert stat.S_ISREG(st.st_mode), f"{rel}: not a regular file"
        if rel in extra:
            continue
        assert rel in versions, f"{rel}: unexpected file under a final name"
        data = read(p)
        assert any(data == v for v in versions[rel]), f"{rel}: content under its final name matches no source version"
    return finals


def source_versions(src: str) -> Dict[str, List[bytes]]:
    out = {}
    for dp, _, fns in os.walk(src):
        for n in fns:
            p = os.path.join(dp, n)
            if os.path.islink(p):
                continue
            out[os.path.relpath(p, src)] = [read(p)]
    return out


# ----------------------------------------------------------------------------- journals
def journal_state(src: str, dst: str, chunk: int) -> Dict[str, dict]:
    """For every source file with a partial on the destination, what its journal proves.

    Returns relpath -> {size, verified (chunk indices whose record matches the current source
    fingerprint and whose .part data re-hashes to the record), unrecorded (chunks whose
    .part data equals the source but that have no valid record), records}.
    Files already under their final name (complete) are not listed.
    """
    out = {}
    for dp, _, fns in os.walk(src):
        for n in fns:
            sp = os.path.join(dp, n)
            if os.path.islink(sp):
                continue
            rel = os.path.relpath(sp, src)
            part, jname = temp_names(rel)
            ddir = os.path.join(dst, os.path.dirname(rel))
            pp, jp = os.path.join(ddir, part), os.path.join(ddir, jname)
            if not (os.path.exists(pp) and os.path.exists(jp)):
                continue
            st = os.stat(sp)
            fp = journal.fingerprint(rel, st.st_size, st.st_mtime_ns, chunk, f"{st.st_dev}:{st.st_ino}")
            jfd = os.open(jp, os.O_RDONLY)
            try:
                jfp, jcs, recs = journal.read_records(jfd)
            finally:
                os.close(jfd)
            sdata = read(sp)
            pdata = read(pp)
            verified = set()
            if jfp == fp and jcs == chunk:
                for off, ln, h in recs:
                    if off % chunk or ln != min(chunk, st.st_size - off) or ln <= 0:
                        continue
                    if xxhash.xxh3_64_intdigest(pdata[off:off + ln]) == h:
                        verified.add(off // chunk)
            recorded = {off // chunk for off, _, _ in recs}
            nchunks = -(-st.st_size // chunk)
            unrecorded = set()
            for i in range(nchunks):
                c = sdata[i * chunk:(i + 1) * chunk]
                if i not in recorded and c.strip(b"\0") and pdata[i * chunk:i * chunk + len(c)] == c:
                    unrecorded.add(i)
            out[rel] = {"size": st.st_size, "verified": verified, "unrecorded": unrecorded, "records": len(recs),
                        "verified_bytes": sum(min(chunk, st.st_size - i * chunk) for i in verified)}
    return out


def bytes_still_needed(src: str, dst: str, chunk: int) -> Tuple[int, int]:
    """(bytes a resume must send, unverified-but-written chunks) from the journals now."""
    js = journal_state(src, dst, chunk)
    need = 0
    unrec = 0
    for dp, _, fns in os.walk(src):
        for n in fns:
            sp = os.path.join(dp, n)
            rel = os.path.relpath(sp, src)
            fp = os.path.join(dst, rel)
            if os.path.isfile(fp) and not os.path.islink(fp) and read(fp) == read(sp):
                continue  # complete under its final name (same size+mtime: skipped)
            size = os.path.getsize(sp)
            if rel in js:
                need += size - js[rel]["verified_bytes"]
                unrec += len(js[rel]["unrecorded"])
            else:
                need += size
    return need, unrec


# ----------------------------------------------------------------------------- processes
def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cli(*args) -> List[str]:
    return [PY, "-m", "automdt", *args]


class ReceiverProc:
    """``automdt receive`` as a subprocess on a fixed port (restartable); killed by PID."""

    def __init__(self, root: str, secret_file: Optional[str], workdir: str, port: int = 0, extra=(), preexec_fn=None):
        self.root, self.secret_file, self.workdir = root, secret_file, workdir
        self.port = port or free_port()
        self.extra = list(extra)
        self.preexec_fn = preexec_fn
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    def start(self, timeout: float = 20.0) -> "ReceiverProc":
        self.starts += 1
        self.errpath = os.path.join(self.workdir, f"receiver-{self.port}-{self.starts}.err")
        args = ["receive", "--listen", f"127.0.0.1:{self.port}", "--root", self.root] + self.extra
        if self.secret_file:
            args += ["--secret-file", self.secret_file]
        with open(self.errpath, "w") as err:
            self.proc = subprocess.Popen(cli(*args), stdout=subprocess.DEVNULL, stderr=err,
                                         preexec_fn=self.preexec_fn)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"receiver exited {self.proc.returncode}: {self.stderr()}")
            if "receiving into" in self.stderr():
                return self
            time.sleep(0.05)
        raise RuntimeError("receiver did not start: " + self.stderr())

    def stderr(self) -> str:
        try:
            with open(self.errpath) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    @property
    def dest(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextlib.contextmanager
def tmpfs(path: str, size: str):
    """Mount a small tmpfs at ``path`` (root only); always unmounted."""
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True)
    if r.returncode != 0:
        import pytest

        pytest.skip(f"cannot mount tmpfs: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


def wait_for(pred, timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def disk_bytes(root: str) -> int:
    """Bytes allocated to every regular file under root (partials and finished files)."""
    total = 0
    for dp, _, fns in os.walk(root):
        for f in fns:
            try:
                total += os.lstat(os.path.join(dp, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def partial_bytes(root: str) -> int:
    total = 0
    for dp, _, fns in os.walk(root):
        for f in fns:
            if f.endswith(".part"):
                try:
                    total += os.stat(os.path.join(dp, f)).st_blocks * 512
                except FileNotFoundError:
                    pass
    return total


# ----------------------------------------------------------------------------- fake sender
class FakeSender:
    """Speaks the control protocol (automdt.protocol.ControlClient) and the data protocol
    (raw sockets, transfer_engine/PROTOCOL.md) with whatever a hostile peer chooses."""

    def __init__(self, ctx, port: int, secret: Optional[bytes] = None, timeout_s: float = 5.0):
        self.c = protocol.ControlClient(ctx, "127.0.0.1", port, timeout_s=timeout_s)
        self.secret = secret
        self.token = b""
        self.data_port = 0
        self.chunk = CHUNK

    def handshake(self, subdir: str = "", chunk: int = CHUNK, **extra) -> dict:
        cn = protocol.nonce()
        ch = self.c.request({"type": "hello", "version": protocol.VERSION, "nonce": cn})
        req = {"type": "auth"}
        if self.secret:
            req["mac"] = protocol.mac(self.secret, "client", ch["nonce"], cn)
        w = self.c.request(req)
        self.token = protocol.data_token(self.secret, ch["nonce"], cn, w.get("token", ""))
        msg = {"type": "open", "subdir": subdir, "chunk_size": chunk, "memory": 1 << 20, "write_threads": 1}
        msg.update(extra)
        r = self.c.request(msg)
        self.data_port = r["data_port"]
        self.chunk = chunk
        return r

    def manifest(self, files: List[dict], dirs: List[str] = ()) -> dict:
        return self.c.request({"type": "manifest", "files": files, "dirs": list(dirs)})

    def activate(self, ids: List[int]) -> dict:
        return self.c.request({"type": "activate", "ids": ids})

    def poll(self) -> dict:
        return self.c.request({"type": "poll"})

    def connect(self, token: Optional[bytes] = None, magic: bytes = b"AMDTDATA") -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.data_port), timeout=5)
        s.sendall(magic + (self.token if token is None else token))
        return s

    def frames(self, fid: int, data: bytes) -> bytes:
        out = bytearray()
        for off in range(0, len(data), self.chunk):
            c = data[off:off + self.chunk]
            out += FRAME.pack(FRAME_MAGIC, fid, off, len(c), 0, frame_hash(c, fid, off)) + c
        return bytes(out)

    def send_files(self, contents: Dict[int, bytes]) -> None:
        s = self.connect()
        try:
            for fid, data in contents.items():
                s.sendall(self.frames(fid, data))
            s.shutdown(socket.SHUT_WR)
        finally:
            s.close()

    def wait_done(self, ids: Iterable[int], timeout: float = 10.0) -> Tuple[set, list]:
        want = set(ids)
        done, errs = set(), []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not want <= done | {e[0] for e in errs}:
            r = self.poll()
            done.update(r.get("done", []))
            errs += r.get("errors", [])
            time.sleep(0.05)
        return done, errs

    def close(self) -> None:
        try:
            self.c.request({"type": "close"}, timeout_s=2)
        except Exception:
            pass
        self.c.close()


def receiver_answers(port: int, ctx, secret: Optional[bytes] = None, timeout_s: float = 3.0) -> bool:
    """A fresh session gets through hello (the control server is still serving)."""
    c = protocol.ControlClient(ctx, "127.0.0.1", port, timeout_s=timeout_s)
    try:
        r = c.request({"type": "hello", "version": protocol.VERSION, "nonce": protocol.nonce()})
        return r.get("type") == "challenge"
    except Exception:
        return False
    finally:
        c.close()
