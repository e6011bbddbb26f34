"""A disk whose power can be cut: the power-loss harness of the fault-injection suite.

A real filesystem (ext4) runs on a loop device whose backing file is served by a small FUSE
filesystem in a process of its own (:class:`CrashDiskFS`). The loop device turns every block write
of ext4 into a FUSE ``write`` and every cache flush (``REQ_PREFLUSH``, ``FUA``: what ext4 issues
at a journal commit, an ``fsync`` or a ``syncfs``) into a FUSE ``fsync``. So the daemon sees what a
disk sees, and keeps what a disk with a volatile write cache keeps:

* the *durable* image: every write before the last flush;
* the *pending* writes since then, in order.

A failing medium (:meth:`CrashDisk.fail`) answers every write and flush with EIO until
:meth:`CrashDisk.heal`. Cutting the power (:meth:`CrashDisk.cut`) makes a crash image from the durable image and some of
the pending writes, then drops every later write (the machine is off; the kernel may still try to
write back). The device models what survives of the pending writes:

* ``flushed``: none of them (the write cache is lost whole);
* ``prefix``: the first k of them, k drawn uniformly (a disk that writes in order);
* ``reorder``: each one independently with probability 1/2 (a disk that reorders its cache).

The filesystem's mount options give the filesystem-level models: ext4's default ``data=ordered``
writes a file's data before the metadata that points at it, while ``data=writeback,nodelalloc``
commits sizes and block maps that can point at data never written (files of the right size full
of zeros, the case a rerun must not trust by size and mtime).

:meth:`CrashDisk.reboot` makes the crash image the disk, and the next :meth:`CrashDisk.mount`
recovers it as a real boot would (ext4 replays its journal). A process that should see the new
boot runs under :func:`new_boot_prefix` (its own mount namespace with another
``/proc/sys/kernel/random/boot_id``).

Needs root, ``/dev/fuse``, ``losetup`` and ``mkfs.ext4``, libfuse 3 and ``mfusepy``
(:func:`available` says whether this machine has them). Every device, mount and process the
harness creates is removed by :meth:`CrashDisk.close`.

Run as ``python -m tests.faults.crashdisk MOUNTPOINT SIZE_BYTES`` it serves the FUSE side.
"""
from __future__ import annotations

import errno
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

IMAGE = "disk.img"
CONTROL = "ctl"
MODELS = ("flushed", "prefix", "reorder")
FS_MODES = {"ordered": "data=ordered,commit=1", "writeback": "data=writeback,nodelalloc,commit=1",
            "still": "data=ordered,commit=300"}
"""ext4 mount options per filesystem model: a journal commit every second, so a transfer of a few
seconds spans several; ``still`` commits only when asked (an fsync), for checks of the disk itself."""
DIRTY_LIMIT = 1 << 20
"""Bytes of dirty page cache the crash disk's device may hold before the kernel writes back."""


def available() -> Optional[str]:
    """None when this machine can run the harness, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "needs root (loop devices, mounts)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    for tool in ("losetup", "blockdev", "mkfs.ext4", "mount", "umount", "unshare"):
        if shutil.which(tool) is None:
            return f"no {tool}"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:  # OSError: mfusepy found no libfuse
        return f"no FUSE binding ({e})"
    return None


# ---------------------------------------------------------------------------------------------
# the FUSE side (its own process)
# ---------------------------------------------------------------------------------------------
def _fs_class() -> Any:
    import mfusepy

    class CrashDiskFS(mfusepy.Operations):
        """The backing file of the loop device (``/disk.img``) and a control file (``/ctl``).

        Runs single-threaded, so a command on the control file is atomic with respect to the
        disk's writes. Commands (one line written to ``/ctl``): ``cut MODEL SEED``, ``boot``,
        ``save NAME``, ``restore NAME``, ``flush``, ``fail`` (every later write and flush answers
        EIO, as a failing medium does), ``heal``; reading ``/ctl`` gives the counters as JSON.
        """

        use_ns = True

        def __init__(self, size: int) -> None:
            self.size = size
            self.current = bytearray(size)  # what reads see
            self.durable = bytearray(size)  # what survives any cut
            self.pending: List[Tuple[int, bytes]] = []
            self.crash: Optional[bytearray] = None  # the image a cut left; None while powered
            self.failing = False  # the medium fails: every write and flush answers EIO
            self.saved: Dict[str, bytes] = {}
            self.stats: Dict[str, Any] = {"writes": 0, "flushes": 0, "dropped": 0, "failed": 0, "cuts": []}
            self.t0 = time.time()

        # --- the files
        def getattr(self, path: str, fh: Optional[int] = None) -> Dict[str, Any]:
            now = int(self.t0 * 1e9)
            base = {"st_uid": 0, "st_gid": 0, "st_atime": now, "st_mtime": now, "st_ctime": now}
            if path == "/":
                return dict(base, st_mode=stat.S_IFDIR | 0o755, st_nlink=2)
            if path == "/" + IMAGE:
                return dict(base, st_mode=stat.S_IFREG | 0o600, st_nlink=1, st_size=self.size)
            if path == "/" + CONTROL:
                return dict(base, st_mode=stat.S_IFREG | 0o600, st_nlink=1, st_size=0)
            raise mfusepy.FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: int) -> List[str]:
            return [".", "..", IMAGE, CONTROL]

        def open(self, path: str, fi: Any) -> int:
            if path not in ("/" + IMAGE, "/" + CONTROL):
                raise mfusepy.FuseOSError(errno.ENOENT)
            fi.direct_io = 1  # no page cache of the backing file: every I/O reaches this process
            fi.fh = 0
            return 0

        def truncate(self, path: str, length: int, fh: Optional[int] = None) -> int:
            return 0

        def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
            if path == "/" + CONTROL:
                body = json.dumps(dict(self.stats, pending=len(self.pending), powered=self.crash is None)).encode()
                return body[offset:offset + size]
            return bytes(self.current[offset:offset + size])

        def write(self, path: str, data: bytes, offset: int, fh: Any) -> int:
            if path == "/" + CONTROL:
                self._command(data.decode().split())
                return len(data)
            if offset + len(data) > self.size:
                raise mfusepy.FuseOSError(errno.ENOSPC)
            if self.crash is not None:  # the power is off: the write never happens
                self.stats["dropped"] += 1
                return len(data)
            if self.failing:
                self.stats["failed"] += 1
                raise mfusepy.FuseOSError(errno.EIO)
            self.current[offset:offset + len(data)] = data
            self.pending.append((offset, bytes(data)))
            self.stats["writes"] += 1
            return len(data)

        def fsync(self, path: str, datasync: int, fh: Any) -> int:
            if path == "/" + IMAGE and self.crash is None:
                if self.failing:
                    self.stats["failed"] += 1
                    raise mfusepy.FuseOSError(errno.EIO)
                self._flush()
            return 0

        def flush(self, path: str, fh: Any) -> int:
            return 0

        def release(self, path: str, fh: Any) -> int:
            return 0

        # --- the disk
        def _flush(self) -> None:
            for off, data in self.pending:
                self.durable[off:off + len(data)] = data
            self.pending = []
            self.stats["flushes"] += 1

        def _command(self, words: Sequence[str]) -> None:
            cmd, args = words[0], list(words[1:])
            if cmd == "flush":
                self._flush()
            elif cmd == "cut":
                model, seed = args[0], int(args[1])
                rng = random.Random(seed)
                keep = list(range(len(self.pending)))
                if model == "flushed":
                    keep = []
                elif model == "prefix":
                    keep = keep[:rng.randint(0, len(keep))]
                elif model == "reorder":
                    keep = [i for i in keep if rng.random() < 0.5]
                else:
                    raise mfusepy.FuseOSError(errno.EINVAL)
                img = bytearray(self.durable)
                for i in keep:
                    off, data = self.pending[i]
                    img[off:off + len(data)] = data
                self.crash = img
                self.stats["cuts"].append({"model": model, "seed": seed, "pending": len(self.pending),
                                           "kept": len(keep), "flushes": self.stats["flushes"]})
            elif cmd == "fail":
                self.failing = True
            elif cmd == "heal":
                self.failing = False
            elif cmd == "boot":
                img = self.crash if self.crash is not None else self.current
                self.current, self.durable, self.pending, self.crash = bytearray(img), bytearray(img), [], None
            elif cmd == "save":
                self._flush()
                self.saved[args[0]] = bytes(self.durable)
            elif cmd == "restore":
                img = self.saved[args[0]]
                self.current, self.durable, self.pending, self.crash = bytearray(img), bytearray(img), [], None
            else:
                raise mfusepy.FuseOSError(errno.EINVAL)

    return CrashDiskFS


def serve(mountpoint: str, size: int) -> None:
    """Serve the crash disk's FUSE filesystem at ``mountpoint`` until it is unmounted."""
    import mfusepy

    mfusepy.FUSE(_fs_class()(size), mountpoint, raw_fi=True, foreground=True, nothreads=True,
                 fsname="amdt-crashdisk")


# ---------------------------------------------------------------------------------------------
# the test side
# ---------------------------------------------------------------------------------------------
def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _retry(cmd: List[str], tries: int = 50, pause: float = 0.1) -> bool:
    """Run ``cmd`` until it succeeds (a device or mount still busy for a moment), at most ``tries``
    times; whether it did."""
    for _ in range(tries):
        if subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0:
            return True
        time.sleep(pause)
    return False


def _run(*cmd: str, timeout: float = 60) -> str:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


class CrashDisk:
    """An ext4 filesystem on a disk whose power :meth:`cut` can cut (see the module's doc).

    :param workdir: an empty directory for the FUSE mount and the filesystem's mount point.
    :param size: the disk's size in bytes (held in the daemon's memory, twice or three times).
    :param fs_mode: a key of :data:`FS_MODES`.
    """

    def __init__(self, workdir: str, size: int = 96 << 20, fs_mode: str = "ordered") -> None:
        if fs_mode not in FS_MODES:
            raise ValueError(f"fs_mode must be one of {sorted(FS_MODES)}")
        self.workdir = workdir
        self.size = int(size)
        self.fs_mode = fs_mode
        self.fuse_dir = os.path.join(workdir, "fuse")
        self.mnt = os.path.join(workdir, "mnt")
        os.makedirs(self.fuse_dir, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        self.loop: Optional[str] = None
        self.mounted = False
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.log = os.path.join(workdir, "crashdisk.log")  # a file, not a pipe: a full pipe would stop the disk
        with open(self.log, "wb") as log:
            self.proc: Optional[subprocess.Popen] = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.crashdisk", self.fuse_dir, str(self.size)], cwd=root,
                stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(self.fuse_dir, IMAGE)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(self.log) as f:
                    err = f.read()
                self.close()
                raise RuntimeError(f"the crash disk's FUSE daemon did not start: {err.strip()[-500:]}")
            time.sleep(0.02)
        # one loop device for the disk's whole life: detaching and attaching at every mount would
        # hand its number to another harness in between
        self._attach()
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loop or "")
        _run("blockdev", "--flushbufs", self.loop or "")
        self.control("save formatted")

    # --- control
    def control(self, command: str) -> None:
        with open(os.path.join(self.fuse_dir, CONTROL), "w") as f:
            f.write(command)

    def stats(self) -> Dict[str, Any]:
        with open(os.path.join(self.fuse_dir, CONTROL)) as f:
            return json.loads(f.read())

    # --- the block device and the filesystem
    def _attach(self) -> None:
        self.loop = _run("losetup", "--find", "--show", os.path.join(self.fuse_dir, IMAGE)).strip()
        self._bdi(DIRTY_LIMIT, 1)

    def _bdi(self, max_bytes: Optional[int], strict: int) -> None:
        """Bound the dirty page cache of this device only (its backing-device-info), so the kernel
        writes back during a transfer as a busy machine does, instead of at the 30 s expiry; None
        gives the device its default share back. The machine's own settings are not touched."""
        st = os.stat(self.loop or "")
        bdi = f"/sys/class/bdi/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        if not os.path.isdir(bdi):
            return
        try:
            if max_bytes is None:
                _write(os.path.join(bdi, "max_ratio"), "100")
            else:
                _write(os.path.join(bdi, "max_bytes"), str(max_bytes))
            _write(os.path.join(bdi, "strict_limit"), str(strict))
        except OSError:
            pass  # an older kernel: the write-back comes later, the harness still works

    def mount(self) -> str:
        """Mount the disk as it is now (after a :meth:`reboot`: ext4 recovers); returns the mount
        point."""
        _run("mount", "-t", "ext4", "-o", FS_MODES[self.fs_mode], self.loop or "", self.mnt)
        self.mounted = True
        return self.mnt

    def unmount(self) -> None:
        """Unmount, and drop the block device's cache: the next mount reads the disk, not what
        the dead machine had cached."""
        if self.mounted:
            _run("umount", self.mnt)
            self.mounted = False
        self._wait_released()
        _run("blockdev", "--flushbufs", self.loop or "")

    def _wait_released(self, timeout: float = 30.0) -> None:
        """Wait until no mount of the filesystem is left anywhere: a process run in its own mount
        namespace (:func:`new_boot_prefix`) holds a copy of the mount, released a moment after it
        exits, and a mount made before that would get the old filesystem back, caches and all."""
        alive = os.path.join("/sys/fs/ext4", os.path.basename(self.loop or ""))
        deadline = time.monotonic() + timeout
        while os.path.exists(alive):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.loop}: the filesystem is still mounted somewhere after {timeout:.0f} s")
            time.sleep(0.02)

    def fresh(self) -> str:
        """Unmount, go back to the freshly formatted disk and mount it."""
        self.unmount()
        self.control("restore formatted")
        return self.mount()

    def cut(self, model: str = "flushed", seed: int = 0) -> Dict[str, Any]:
        """Cut the power: the crash image is taken now (``model``: :data:`MODELS`); every later
        write is dropped. Returns what the cut kept (pending writes, kept, flushes so far)."""
        if model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}")
        self.control(f"cut {model} {int(seed)}")
        return self.stats()["cuts"][-1]

    def fail(self) -> None:
        """From now on the medium fails: every write and cache flush answers EIO (ext4 then
        reports write-back errors and, when its journal cannot be written, goes read-only)."""
        self.control("fail")

    def heal(self) -> None:
        """The medium works again (what failed was never written)."""
        self.control("heal")

    def reboot(self) -> str:
        """After :meth:`cut` (and after every process using the disk has ended): unmount what the
        dead machine had, make the crash image the disk and mount it again; returns the mount point."""
        self.unmount()
        self.control("boot")
        return self.mount()

    def close(self) -> None:
        """Unmount, detach and stop the daemon; what is still busy is retried for a while, then
        detached lazily, so no mount or device outlives the harness."""
        try:
            if self.mounted:
                if not _retry(["umount", self.mnt]):
                    subprocess.run(["umount", "-l", self.mnt], capture_output=True, timeout=30)
                self.mounted = False
            if self.loop is not None:
                self._bdi(None, 0)
                _retry(["losetup", "-d", self.loop])
                self.loop = None
        finally:
            if self.proc is not None:
                # the loop device lets go of the image a moment after it is detached
                if not _retry(["umount", self.fuse_dir]):
                    subprocess.run(["umount", "-l", self.fuse_dir], capture_output=True, timeout=30)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
                self.proc = None

    def __enter__(self) -> "CrashDisk":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def new_boot_prefix(workdir: str) -> List[str]:
    """A command prefix that runs a process as if the machine had booted again: in its own mount
    namespace, ``/proc/sys/kernel/random/boot_id`` reads a new id."""
    path = os.path.join(workdir, "boot_id")
    with open(path, "w") as f:
        f.write(str(uuid.uuid4()) + "\n")
    script = 'mount --bind "$0" /proc/sys/kernel/random/boot_id && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, path]


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
