"""Two network namespaces joined by a veth pair, with an optional tc rate limit: the one helper
behind every experiment, benchmark, script and test that needs a real (non-loopback) TCP path on
one machine (the fairness experiment's shared link, the ``net`` paths of
:mod:`automdt.experiments.realpaths`, ``benchmarks/``).

Everything it creates lives in namespaces it creates itself: the /30 addresses (10.77.0.1 and
10.77.0.2 by default) exist only inside them, and deleting a namespace also deletes its end of
the veth pair, so ``close()`` leaves nothing behind. ``close()`` runs from ``with`` blocks, from
``atexit`` and is idempotent; :func:`reap_stale` removes what a SIGKILLed run left.

    from automdt.experiments.netns import NetnsPair, netns_available

    ok, why = netns_available()
    with NetnsPair(rate="5gbit") as link:
        link.exec_argv("b", ["iperf3", "-s", "-B", link.addr_b])   # argv for subprocess
        link.exec_argv("a", ["iperf3", "-c", link.addr_b, "-t", "5"])

Each namespace gets its own /etc/hosts (``/etc/netns/<name>/hosts``, which ``ip netns exec``
mounts over /etc/hosts) naming both addresses, and the machine's host name as that namespace's
own address, so programs that look their own address up (globus-gridftp-server does) resolve
it without a DNS server.

The rate limit is a tbf (or htb) qdisc on the egress of each veth end (``both_ways``: data
A -> B and its ACKs B -> A see the same link), or of A's end only (a sender's bottleneck link,
as in Marlin's fairness experiment). This kernel has tbf and htb, but no netem, fq or police: no
delay is added (:mod:`automdt.experiments.delay_forwarder` adds one in user space).
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import socket
import subprocess
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

__all__ = ["NetnsPair", "netns_available", "rate_bits", "reap_stale"]

_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)?$", re.I)


def netns_available() -> Tuple[bool, str]:
    """``(True, "")`` if this process can create network namespaces, veth pairs and tc qdiscs,
    else ``(False, reason)``."""
    if os.geteuid() != 0:
        return False, "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` not found (Debian package iproute2)"
    return True, ""


def rate_bits(rate: Union[str, float]) -> float:
    """'5gbit' -> 5e9 bits/s (tc's units: k/m/g are powers of 1000; 'bps' means bytes/s); a
    number is bytes/s."""
    if not isinstance(rate, str):
        return float(rate) * 8
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

    :param rate: the link rate: tc units ("5gbit", "40mbps") or bytes/s (a number); None: no limit.
    :param qdisc: "tbf" or "htb".
    :param prefix: name prefix of the namespaces and interfaces (the creator's PID and a random
        tag follow, so concurrent pairs never collide and :func:`reap_stale` finds orphans).
    :param both_ways: limit the egress of both ends (default) or of A's only.
    :param burst_min: the bucket's least size in bytes (it holds at least 4 ms at the rate).
    """

    def __init__(self, rate: Union[str, float, None] = "5gbit", qdisc: str = "tbf", prefix: str = "amdt",
                 addr_a: str = "10.77.0.1", addr_b: str = "10.77.0.2", mtu: Optional[int] = None,
                 both_ways: bool = True, burst_min: int = 256 * 1024) -> None:
        if qdisc not in ("tbf", "htb"):
            raise ValueError("qdisc must be tbf or htb")
        tag = uuid.uuid4().hex[:6]
        # the creator's PID in the name lets reap_stale() remove namespaces of a killed run
        self.ns_a, self.ns_b = f"{prefix}A-{os.getpid()}-{tag}", f"{prefix}B-{os.getpid()}-{tag}"
        # interface names are at most 15 characters
        self.if_a, self.if_b = f"{prefix[:4]}a{tag}", f"{prefix[:4]}b{tag}"
        self.addr_a, self.addr_b = addr_a, addr_b
        self.rate_bits = None if rate is None else rate_bits(rate)
        self.qdisc, self.mtu, self.both_ways, self.burst_min = qdisc, mtu, both_ways, int(burst_min)
        self._created: List[str] = []
        self._veth = False
        self._closed = False

    @property
    def rate_bps(self) -> Optional[float]:
        """The link rate in bytes/s (None: no limit)."""
        return None if self.rate_bits is None else self.rate_bits / 8

    # ------------------------------------------------------------------ set-up
    def __enter__(self) -> "NetnsPair":
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
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
            if self.rate_bits is not None:
                for side in self._limited():
                    self._qdisc(side, "add")
        except BaseException:
            self.close()
            raise
        return self

    def _limited(self) -> Tuple[str, ...]:
        return ("a", "b") if self.both_ways else ("a",)

    def _qdisc(self, side: str, verb: str) -> None:
        """``tc qdisc add|change`` (tbf) or the htb class, on ``side``'s egress at the current rate."""
        assert self.rate_bits is not None
        bits = f"{int(self.rate_bits)}bit"
        # the bucket must hold well over one GSO super-packet (64 KiB) and one timer tick of
        # data; 4 ms worth at the rate (5 Gbit/s: 2.5 MB) is enough for HZ >= 250
        burst = str(max(self.burst_min, int(self.rate_bits / 8 * 0.004)))
        tc = ["ip", "netns", "exec", self.ns(side), "tc"]
        dev = self.if_a if side == "a" else self.if_b
        if self.qdisc == "tbf":
            _run(tc + ["qdisc", verb, "dev", dev, "root", "tbf", "rate", bits, "burst", burst, "latency", "20ms"])
            return
        if verb == "add":
            _run(tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"])
        _run(tc + ["class", verb, "dev", dev, "parent", "1:", "classid", "1:10", "htb",
                   "rate", bits, "ceil", bits, "burst", burst, "cburst", burst])

    def set_rate(self, rate: Union[str, float]) -> None:
        """Change the link rate now (``tc qdisc change`` / ``tc class change``); the pair must
        have been opened with a rate."""
        if self.rate_bits is None:
            raise RuntimeError("set_rate needs a pair opened with a rate")
        self.rate_bits = rate_bits(rate)
        for side in self._limited():
            self._qdisc(side, "change")

    # ------------------------------------------------------------------ use
    def ns(self, side: str) -> str:
        return {"a": self.ns_a, "b": self.ns_b}[side.lower()]

    def exec_argv(self, side: str, argv: Sequence[str]) -> List[str]:
        """argv that runs ``argv`` inside namespace A or B (``ip netns exec`` execs it, so the
        PID of the started process is the PID of the program itself)."""
        return ["ip", "netns", "exec", self.ns(side)] + list(argv)

    def qdisc_show(self, side: str = "a") -> str:
        """``tc -s qdisc show`` of ``side``'s veth end (counters included), and ``tc class show``
        (htb's rate is its class's)."""
        ifname = self.if_a if side == "a" else self.if_b
        tc = ["ip", "netns", "exec", self.ns(side), "tc"]
        return "".join(_run(tc + what + ["show", "dev", ifname], check=False).stdout
                       for what in (["-s", "qdisc"], ["class"]))

    def describe(self) -> Dict[str, Any]:
        """What a results file records of the link."""
        return {"namespaces": [self.ns_a, self.ns_b], "veth": [self.if_a, self.if_b],
                "addresses": [self.addr_a, self.addr_b], "qdisc": self.qdisc, "rate_bps": self.rate_bps,
                "rate_bit": None if self.rate_bits is None else int(self.rate_bits),
                "limited": "both ways" if self.both_ways else "A's egress"}

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
