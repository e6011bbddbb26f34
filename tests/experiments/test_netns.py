"""The one namespace/tc helper (automdt.experiments.netns.NetnsPair): both qdiscs, one-way and
two-way limits, a rate change at run time, a real TCP path between the two ends, and nothing
left behind."""
from __future__ import annotations

import subprocess
import sys

import pytest

from automdt.experiments.netns import NetnsPair, netns_available, rate_bits

pytestmark = pytest.mark.netns


def test_rate_units():
    assert rate_bits("5gbit") == 5e9 and rate_bits("40mbps") == 320e6 and rate_bits(40e6) == 320e6
    with pytest.raises(ValueError):
        rate_bits("fast")


@pytest.mark.parametrize("qdisc,both_ways", [("tbf", True), ("htb", False)])
def test_pair_limits_changes_rate_and_goes_away(qdisc, both_ways):
    ok, why = netns_available()
    if not ok:
        pytest.skip(why)
    with NetnsPair(rate=40e6, qdisc=qdisc, prefix="amdtt", both_ways=both_ways) as link:
        assert "rate 320Mbit" in link.qdisc_show("a")
        assert ("rate 320Mbit" in link.qdisc_show("b")) is both_ways
        link.set_rate("20mbps")
        assert "rate 160Mbit" in link.qdisc_show("a") and link.rate_bps == 20e6
        assert link.describe()["rate_bit"] == 160_000_000
        # a real TCP path: a listener in B, a client in A
        code = ("import socket,sys; s=socket.create_server((sys.argv[1], 0)); print(s.getsockname()[1], flush=True);"
                "c,_=s.accept(); print(len(c.recv(10)))")
        srv = subprocess.Popen(link.exec_argv("b", [sys.executable, "-c", code, link.addr_b]), stdout=subprocess.PIPE,
                               text=True)
        try:
            port = srv.stdout.readline().strip()
            subprocess.run(link.exec_argv("a", [sys.executable, "-c", "import socket,sys; socket.create_connection("
                                                "(sys.argv[1], int(sys.argv[2]))).sendall(b'hello')",
                                                link.addr_b, port]), check=True, timeout=20)
            assert srv.stdout.readline().strip() == "5"
        finally:
            srv.kill()
            srv.wait(10)
        names = (link.ns_a, link.ns_b)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not set(names) & set(listed)
