"""The experiments' scenarios and datasets, as data.

**Bottleneck scenarios.** Marlin's Figure 7 (ICS'23, section 4.2) throttles, on Emulab, one
stage per thread (30 Mbit/s per read thread) and the path (300 Mbit/s) so that the optimum is
10 threads on the bottleneck stage and 3 on the others; the AutoMDT slides repeat the read-,
network- and write-bound set-ups on CloudLab. Here the engine's own rate limits play the disks
and the link, scaled to a shared 2-core machine whose loopback moves 300-500 MB/s end to end:

============  ==========================  ===========================  ==========
scenario      bottleneck stage            other two stages              optimum
============  ==========================  ===========================  ==========
read-bound    read: 10 MB/s per thread,   40 MB/s per thread,          (8, 2, 2)
              80 MB/s in total            200 MB/s in total
net-bound     net: 10 MB/s per connection, same                        (2, 8, 2)
              80 MB/s in total
write-bound   write: 10 MB/s per thread,  same                         (2, 2, 8)
              80 MB/s in total
============  ==========================  ===========================  ==========

Every stage is throttled (per thread and in total), so the path is analytic: stage ``i`` with
``n`` threads moves ``min(n * tpt_i, B_i)``; the achievable throughput is ``min_i B_i`` (80 MB/s),
the bottleneck stage needs ``ceil(80 / 10) = 8`` threads and each other stage
``ceil(80 / 40) = 2``. :meth:`Scenario.profile` is that path as a simulator
:class:`~automdt.simulator.profile.Profile`, and the simulator's oracle confirms the optimum.
80 MB/s is a quarter of what the machine moves unthrottled, so the throttles, not the CPU, set
the rate even while other work shares the cores. ``Scenario.scaled`` builds the same shapes at
other rates.

**Datasets** are generated reproducibly from a seed (:meth:`DatasetSpec.generate`):

* ``large``: a few equal large files (the slides' "500 x 2 GB" scaled down);
* ``mixed``: the slides' mix by file count, 80% medium (1-100 MB, log-uniform), 10% large
  (1-2 GB), 5% small (0.5-1 MB); the slides leave the last 5% unspecified, and here it fills the
  gap between the medium and large classes (100 MB-1 GB, log-uniform). The sizes are drawn at
  full scale and then all multiplied by one factor so that the total is ``total_bytes`` (the
  factor is recorded): the *shape* of the mix is the slides', the absolute sizes are scaled so
  that a run takes seconds, not hours.

File contents come from a 16 MiB pseudo-random pool seeded by the dataset seed, each file a
cyclic slice of it starting at an offset drawn from the seed: incompressible, reproducible and
cheap to write (the engine neither compresses nor deduplicates, so repeated blocks are fine).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from automdt.simulator.profile import STAGES, Profile, StageProfile
from automdt.policy_contract import K_DEFAULT

MB = 1_000_000
"""Throttles and rates are in SI units (the CLI's ``M``), as ``--throttle`` takes them
(``docs/cli.md``, "Sizes and rates")."""
MiB = 1 << 20

DEFAULT_MEMORY = 128 * MiB
"""Staging buffer per side in the experiments: ~1.6 s of the 80 MB/s bottleneck."""
DEFAULT_CHUNK = 1 * MiB
"""Chunk size in the experiments: at 10 MB/s per thread a 4 MiB chunk takes 0.4 s, which makes
1-second throughput samples lumpy; 1 MiB chunks keep them within a few percent."""
DEFAULT_INTERVAL_S = 1.0
DEFAULT_MAX_THREADS = 32


@dataclass(frozen=True)
class Scenario:
    """One emulated path: per-thread and total rate limits for each stage.

    :param name: short name (``read-bound``...).
    :param bottleneck: the stage whose total limit is the smallest.
    :param throttle: ``{stage: (per_thread_bps, total_bps)}`` as :class:`~automdt.sender.TransferOptions`
        takes it; every stage is throttled so that the path is analytic.
    :param description: one line for tables and plots.
    :param max_threads: per-stage thread bound of the transfers.
    """

    name: str
    bottleneck: str
    throttle: Dict[str, Tuple[float, float]]
    description: str = ""
    max_threads: int = DEFAULT_MAX_THREADS

    def __post_init__(self) -> None:
        if self.bottleneck not in STAGES:
            raise ValueError(f"scenario {self.name}: bottleneck must be one of {STAGES}")
        for s in STAGES:
            tpt, total = self.throttle[s]
            if not (tpt > 0 and total > 0):
                raise ValueError(f"scenario {self.name}: stage {s} needs a per-thread and a total limit")
        caps = [min(self.max_threads * self.throttle[s][0], self.throttle[s][1]) for s in STAGES]
        if STAGES[int(np.argmin(caps))] != self.bottleneck:
            raise ValueError(f"scenario {self.name}: the slowest stage is not {self.bottleneck}")

    # ------------------------------------------------------------------ analytic figures
    @property
    def achievable_bps(self) -> float:
        """The best steady-state end-to-end throughput: ``min_i min(max_threads * tpt_i, B_i)``."""
        return float(min(min(self.max_threads * self.throttle[s][0], self.throttle[s][1]) for s in STAGES))

    @property
    def min_threads(self) -> Dict[str, int]:
        """Fewest threads with which each stage carries the achievable throughput."""
        a = self.achievable_bps
        return {s: max(1, math.ceil(a / self.throttle[s][0] - 1e-9)) for s in STAGES}

    @property
    def min_bottleneck_threads(self) -> int:
        """Fewest bottleneck-stage threads that reach the achievable throughput."""
        return self.min_threads[self.bottleneck]

    @property
    def optimum(self) -> Tuple[int, int, int]:
        """The minimal triple ``(n_r, n_n, n_w)`` that reaches the achievable throughput."""
        m = self.min_threads
        return (m["read"], m["net"], m["write"])

    def profile(self, memory: int = DEFAULT_MEMORY, interval_s: float = DEFAULT_INTERVAL_S,
                noise: float = 0.0) -> Profile:
        """This path as a simulator profile (the throttles are exactly the ``min(n*tpt, B)`` model)."""
        st = {s: StageProfile(float(self.throttle[s][0]), float(self.throttle[s][1])) for s in STAGES}
        return Profile(read=st["read"], net=st["net"], write=st["write"], sender_buffer=int(memory),
                       receiver_buffer=int(memory), interval_s=float(interval_s), max_threads=self.max_threads,
                       noise=float(noise), meta={"scenario": self.name, "source": "automdt.experiments.scenarios"})

    def oracle_threads(self, memory: int = DEFAULT_MEMORY, k: float = K_DEFAULT) -> Tuple[int, int, int]:
        """The simulator oracle's steady-state triple for :meth:`profile` (should equal :attr:`optimum`)."""
        from automdt.simulator.oracle import oracle

        return tuple(int(x) for x in oracle(self.profile(memory), k).threads)  # type: ignore[return-value]

    def throttle_spec(self) -> str:
        """The same throttles as the CLI's ``--throttle`` string (``read.thread=10M,...``)."""
        parts = []
        for s in STAGES:
            tpt, total = self.throttle[s]
            parts += [f"{s}.thread={_si(tpt)}", f"{s}.total={_si(total)}"]
        return ",".join(parts)

    def to_dict(self) -> Dict[str, object]:
        return {
            "name": self.name, "bottleneck": self.bottleneck, "description": self.description,
            "throttle": {s: list(self.throttle[s]) for s in STAGES}, "throttle_spec": self.throttle_spec(),
            "max_threads": self.max_threads, "achievable_bps": self.achievable_bps,
            "min_threads": self.min_threads, "optimum": list(self.optimum),
        }

    @classmethod
    def scaled(cls, bottleneck: str, rate_bps: float = 80 * MB, bottleneck_threads: int = 8,
               other_threads: int = 2, headroom: float = 2.5, max_threads: int = DEFAULT_MAX_THREADS,
               name: Optional[str] = None) -> "Scenario":
        """A scenario with bottleneck ``bottleneck`` at ``rate_bps``.

        The bottleneck stage gets ``rate / bottleneck_threads`` per thread and ``rate`` in total;
        the others ``rate / other_threads`` per thread and ``headroom * rate`` in total.
        """
        thr = {}
        for s in STAGES:
            if s == bottleneck:
                thr[s] = (rate_bps / bottleneck_threads, rate_bps)
            else:
                thr[s] = (rate_bps / other_threads, headroom * rate_bps)
        desc = (f"{bottleneck} {_si(rate_bps / bottleneck_threads)}B/s per thread, {_si(rate_bps)}B/s total; "
                f"others {_si(rate_bps / other_threads)}B/s per thread, {_si(headroom * rate_bps)}B/s total")
        short = {"read": "read", "net": "net", "write": "write"}[bottleneck]
        return cls(name or f"{short}-bound", bottleneck, thr, desc, max_threads)


def _si(x: float) -> str:
    for unit, f in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= f and abs(x / f - round(x / f, 3)) < 1e-9:
            v = round(x / f, 3)
            return f"{int(v) if v == int(v) else v}{unit}"
    return str(int(x)) if x == int(x) else str(x)


def bottleneck_scenarios(rate_bps: float = 80 * MB, max_threads: int = DEFAULT_MAX_THREADS) -> Dict[str, Scenario]:
    """The three scenarios of the module docstring, by name."""
    return {sc.name: sc for sc in (Scenario.scaled(b, rate_bps, max_threads=max_threads) for b in STAGES)}


SCENARIOS: Dict[str, Scenario] = bottleneck_scenarios()
"""``read-bound``, ``net-bound``, ``write-bound`` at 80 MB/s."""


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------
MIXED_CLASSES: Tuple[Tuple[str, float, float, float, str], ...] = (
    # name, fraction of files, low, high (bytes, full scale), distribution
    ("medium", 0.80, 1 * MB, 100 * MB, "log"),
    ("large", 0.10, 1000 * MB, 2000 * MB, "uniform"),
    ("small", 0.05, 0.5 * MB, 1 * MB, "uniform"),
    ("gap", 0.05, 100 * MB, 1000 * MB, "log"),
)
"""The AutoMDT slides' mixed dataset (fractions of the file count), before scaling."""

POOL_BYTES = 16 * MiB


@dataclass(frozen=True)
class DatasetSpec:
    """A reproducible dataset: ``kind`` (``large`` or ``mixed``), target size, file count, seed."""

    kind: str
    total_bytes: int
    n_files: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("large", "mixed"):
            raise ValueError(f"dataset kind must be 'large' or 'mixed', got {self.kind!r}")
        if self.n_files < 1 or self.total_bytes < self.n_files:
            raise ValueError("dataset needs at least one file and one byte per file")

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.n_files}f-{self.total_bytes // MB}MB-s{self.seed}"

    def sizes(self) -> Tuple[List[int], Dict[str, object]]:
        """File sizes (bytes) and a description of how they were drawn."""
        if self.kind == "large":
            base = self.total_bytes // self.n_files
            sizes = [base] * self.n_files
            sizes[-1] += self.total_bytes - base * self.n_files
            return sizes, {"kind": "large", "file_bytes": base}
        rng = np.random.default_rng([self.seed, 0x5EED])
        counts = _class_counts(self.n_files, [c[1] for c in MIXED_CLASSES])
        raw: List[float] = []
        labels: List[str] = []
        for (name, _, lo, hi, dist), cnt in zip(MIXED_CLASSES, counts):
            u = rng.random(cnt)
            v = np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo))) if dist == "log" else lo + u * (hi - lo)
            raw += list(v)
            labels += [name] * cnt
        order = rng.permutation(len(raw))
        raw = [raw[i] for i in order]
        labels = [labels[i] for i in order]
        scale = self.total_bytes / float(sum(raw))
        sizes = [max(1, int(round(x * scale))) for x in raw]
        sizes[int(np.argmax(sizes))] += self.total_bytes - sum(sizes)
        per_class = {c[0]: {"files": int(cnt), "bytes": int(sum(s for s, l in zip(sizes, labels) if l == c[0])),
                            "range_bytes": [int(c[2] * scale), int(c[3] * scale)]}
                     for c, cnt in zip(MIXED_CLASSES, counts)}
        return sizes, {"kind": "mixed", "scale": scale, "classes": per_class, "labels": labels}

    def generate(self, root: str) -> "Dataset":
        """Write the files under ``root/<name>`` (re-used if already complete); return the dataset."""
        sizes, info = self.sizes()
        path = os.path.join(root, self.name)
        os.makedirs(path, exist_ok=True)
        pool = np.random.default_rng([self.seed, 0xDA7A]).bytes(POOL_BYTES)
        pool2 = pool + pool  # cyclic slices without wrap-around logic
        rng = np.random.default_rng([self.seed, 0x0FF5])
        offsets = rng.integers(0, POOL_BYTES, size=len(sizes))
        width = len(str(len(sizes)))
        files = []
        for i, (size, off) in enumerate(zip(sizes, offsets)):
            rel = f"d{i % 4}/f{i:0{width}d}.bin" if self.kind == "mixed" else f"f{i:0{width}d}.bin"
            fp = os.path.join(path, rel)
            files.append(rel)
            if os.path.exists(fp) and os.path.getsize(fp) == size:
                continue
            os.makedirs(os.path.dirname(fp), exist_ok=True)
            tmp = fp + ".tmp"
            with open(tmp, "wb") as f:
                left, o = size, int(off)
                while left > 0:
                    n = min(left, POOL_BYTES)
                    f.write(memoryview(pool2)[o:o + n])
                    left -= n
                    o = (o + n) % POOL_BYTES
            os.replace(tmp, fp)
        digest = hashlib.sha256(",".join(map(str, sizes)).encode()).hexdigest()[:16]
        return Dataset(spec=self, path=path, files=files, sizes=sizes, info=info, sizes_sha=digest)

    def to_dict(self) -> Dict[str, object]:
        return dataclasses.asdict(self) | {"name": self.name}


@dataclass
class Dataset:
    """A generated dataset on disk."""

    spec: DatasetSpec
    path: str
    files: List[str]
    sizes: List[int]
    info: Dict[str, object] = field(default_factory=dict)
    sizes_sha: str = ""

    @property
    def total_bytes(self) -> int:
        return int(sum(self.sizes))

    @property
    def avg_file_size(self) -> float:
        return self.total_bytes / max(1, len(self.sizes))

    def to_dict(self) -> Dict[str, object]:
        info = {k: v for k, v in self.info.items() if k != "labels"}
        return {"spec": self.spec.to_dict(), "path": self.path, "files": len(self.files),
                "total_bytes": self.total_bytes, "min_file": min(self.sizes), "max_file": max(self.sizes),
                "sizes_sha256_16": self.sizes_sha, "info": info}


def _class_counts(n: int, fractions: Sequence[float]) -> List[int]:
    """Largest-remainder apportionment of ``n`` files to the classes (every class >= 1 if n allows)."""
    raw = [f * n for f in fractions]
    counts = [int(math.floor(x)) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)[: n - sum(counts)]:
        counts[i] += 1
    if n >= len(fractions):
        for i, c in enumerate(counts):
            if c == 0:
                j = int(np.argmax(counts))
                counts[j] -= 1
                counts[i] = 1
    return counts


def large_dataset(total_bytes: int, n_files: int = 4, seed: int = 0) -> DatasetSpec:
    return DatasetSpec("large", int(total_bytes), int(n_files), int(seed))


def mixed_dataset(total_bytes: int, n_files: int = 100, seed: int = 0) -> DatasetSpec:
    return DatasetSpec("mixed", int(total_bytes), int(n_files), int(seed))


def default_data_root() -> str:
    """``/dev/shm`` when it exists and is writable (memory-speed disks), else the temp dir."""
    import tempfile

    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()
