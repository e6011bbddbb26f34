"""Two network namespaces joined by a veth pair, with an optional tc rate limit.

A reusable helper for benchmarks and tests that need a real (non-loopback) TCP path on one
machine. Everything it creates lives in namespaces it creates itself: the /30 addresses
(10.77.0.1 and 10.77.0.2 by default) exist only inside them, and deleting a namespace also
deletes its end of the veth pair, so ``close()`` leaves nothing behind. ``close()`` runs from
``with`` blocks, from ``atexit`` and is idempotent.

    from netns import NetnsPair, netns_available

    ok, why = netns_available()
    with NetnsPair(rate="5gbit") as link:
        link.exec_argv("b", ["iperf3", "-s", "-B", link.addr_b])   # argv for subprocess
        link.exec_argv("a", ["iperf3", "-c", link.addr_b, "-t", "5"])

Each namespace gets its own /etc/hosts (``/etc/netns/<name>/hosts``, which ``ip netns exec``
mounts over /etc/hosts) naming both addresses, and the machine's host name as that namespace's
own address, so programs that look their own address up (globus-gridftp-server does) resolve
it without a DNS server.

The rate limit is a tbf (or htb) qdisc on the egress of each veth end (this kernel has tbf and
htb, but no netem, fq or police), so data A -> B and its ACKs B -> A see the same link.
No delay is added: the kernel offers no delay qdisc here.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import socket
import subprocess
import uuid
from typing import List, Optional, Sequence

from automdt.experiments.netns import netns_available

__all__ = ["NetnsPair", "netns_available", "rate_bits", "reap_stale"]

_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)?$", re.I)


def rate_bits(rate: str) -> float:
    """'5gbit' -> 5e9 bits/s (tc's units: k/m/g are powers of 1000; 'bps' means bytes/s)."""
    m = _RATE.match(rate.strip())
    if not m:
        raise ValueError(f"bad rate {rate!r} (e.g. 500mbit, 5gbit)")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    return value * 8 if (m.group(3) or "bit").lower() == "bps" else value


def _run(argv: Sequence[str], check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def reap_stale(prefix: str = "amdt") -> List[str]:
    """Delete namespaces left by a NetnsPair(prefix=...) whose creating process is gone (it was
    SIGKILLed before its clean-up ran). Returns the names deleted. Only names of exactly this
    module's pattern are touched."""
    if netns_available()[0] is False:
        return []
    pat = re.compile(rf"^{re.escape(prefix)}[AB]-(\d+)-[0-9a-f]{{6}}$")
    gone = []
    for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = pat.match(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            if _run(["ip", "netns", "del", name], check=False).returncode == 0:
                gone.append(name)
            shutil.rmtree(os.path.join("/etc/netns", name), ignore_errors=True)
    return gone


class NetnsPair:
    """Namespaces A and B, veth ``a`` in A (addr_a) and ``b`` in B (addr_b), a /30 between them.

    rate: e.g. "5gbit" (None: no limit); qdisc: "tbf" or "htb"; both directions are limited.
    """

    def __init__(self, rate: Optional[str] = "5gbit", qdisc: str = "tbf", prefix: str = "amdt",
                 addr_a: str = "10.77.0.1", addr_b: str = "10.77.0.2", mtu: Optional[int] = None) -> None:
        if qdisc not in ("tbf", "htb"):
            raise ValueError("qdisc must be tbf or htb")
        tag = uuid.uuid4().hex[:6]
        # the creator's PID in the name lets reap_stale() remove namespaces of a killed run
        self.ns_a, self.ns_b = f"{prefix}A-{os.getpid()}-{tag}", f"{prefix}B-{os.getpid()}-{tag}"
        # interface names are at most 15 characters
        self.if_a, self.if_b = f"{prefix[:4]}a{tag}", f"{prefix[:4]}b{tag}"
        self.addr_a, self.addr_b = addr_a, addr_b
        self.rate, self.qdisc, self.mtu = rate, qdisc, mtu
        self._created: List[str] = []
        self._veth = False
        self._closed = False

    # ------------------------------------------------------------------ set-up
    def __enter__(self) -> "NetnsPair":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> "NetnsPair":
        ok, why = netns_available()
        if not ok:
            raise RuntimeError(why)
        atexit.register(self.close)
        try:
            for ns, own in ((self.ns_a, self.addr_a), (self.ns_b, self.addr_b)):
                _run(["ip", "netns", "add", ns])
                self._created.append(ns)
                etc = os.path.join("/etc/netns", ns)
                os.makedirs(etc, exist_ok=True)
                with open(os.path.join(etc, "hosts"), "w") as f:  # the host name is this namespace's address
                    f.write(f"127.0.0.1\tlocalhost\n{own}\t{socket.gethostname()}\n"
                            f"{self.addr_a}\tnetns-a\n{self.addr_b}\tnetns-b\n")
            _run(["ip", "link", "add", self.if_a, "type", "veth", "peer", "name", self.if_b])
            self._veth = True
            _run(["ip", "link", "set", self.if_a, "netns", self.ns_a])
            _run(["ip", "link", "set", self.if_b, "netns", self.ns_b])
            self._veth = False   # now owned by the namespaces: deleting them deletes it
            for ns, ifname, addr in ((self.ns_a, self.if_a, self.addr_a), (self.ns_b, self.if_b, self.addr_b)):
                _run(["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", ifname])
                if self.mtu:
                    _run(["ip", "-n", ns, "link", "set", ifname, "mtu", str(self.mtu)])
                _run(["ip", "-n", ns, "link", "set", ifname, "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
                if self.rate:
                    self._limit(ns, ifname)
        except BaseException:
            self.close()
            raise
        return self

    def _limit(self, ns: str, ifname: str) -> None:
        bits = rate_bits(self.rate)
        # the bucket must hold well over one GSO super-packet (64 KiB) and one timer tick of
        # data; 4 ms worth at the rate (5 Gbit/s: 2.5 MB) is enough for HZ >= 250
        burst = max(256 * 1024, int(bits / 8 * 0.004))
        tc = ["ip", "netns", "exec", ns, "tc"]
        if self.qdisc == "tbf":
            _run(tc + ["qdisc", "add", "dev", ifname, "root", "tbf", "rate", self.rate,
                       "burst", str(burst), "latency", "20ms"])
        else:
            _run(tc + ["qdisc", "add", "dev", ifname, "root", "handle", "1:", "htb", "default", "10"])
            _run(tc + ["class", "add", "dev", ifname, "parent", "1:", "classid", "1:10", "htb",
                       "rate", self.rate, "ceil", self.rate, "burst", str(burst), "cburst", str(burst)])

    # ------------------------------------------------------------------ use
    def ns(self, side: str) -> str:
        return {"a": self.ns_a, "b": self.ns_b}[side.lower()]

    def exec_argv(self, side: str, argv: Sequence[str]) -> List[str]:
        """argv that runs ``argv`` inside namespace A or B (``ip netns exec`` execs it, so the
        PID of the started process is the PID of the program itself)."""
        return ["ip", "netns", "exec", self.ns(side)] + list(argv)

    def qdisc_show(self, side: str = "a") -> str:
        ifname = self.if_a if side == "a" else self.if_b
        return _run(["ip", "netns", "exec", self.ns(side), "tc", "-s", "qdisc", "show", "dev", ifname]).stdout

    # ------------------------------------------------------------------ tear-down
    def close(self) -> None:
        """Delete both namespaces (and with them the veth pair). Safe to call more than once.
        Processes still running inside must have been ended by their owner first."""
        if self._closed:
            return
        self._closed = True
        if self._veth:
            _run(["ip", "link", "del", self.if_a], check=False)
        for ns in reversed(self._created):
            _run(["ip", "netns", "del", ns], check=False)
            shutil.rmtree(os.path.join("/etc/netns", ns), ignore_errors=True)
        self._created.clear()
        try:
            atexit.unregister(self.close)
        except Exception:  # pragma: no cover
            pass
