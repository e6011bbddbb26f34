"""The optional TLS data path: identical copies, ciphertext on the wire, wrong keys refused."""
from __future__ import annotations

import os
import socket
import ssl

import pytest

from automdt.transfer_engine import switches
from tests.util import TcpTap

from .conftest import te, wait_for

CHUNK = 64 * 1024


@pytest.mark.parametrize("batch", [(True, True), (False, False), (True, False)])
def test_tls_copy_identical_with_churn_and_corruption_hook(rig, batch):
    """Batched records (the default) and the switch tls_batch=0 (one socket call per record) on
    either end: the same bytes arrive."""
    key = os.urandom(32)
    tx_sw, rx_sw = (switches.Switches(tls_batch=b) for b in batch)
    r = rig(chunk=CHUNK, threads=(2, 3, 2), sender_kw={"tls_key": key, "switches": tx_sw},
            receiver_kw={"tls_key": key, "switches": rx_sw})
    assert r.tx.encrypted and r.rx.encrypted
    sizes = [0 + 1, CHUNK - 1, CHUNK, CHUNK + 1, 7 * CHUNK + 3, 3 << 20]
    for fid, size in enumerate(sizes, start=1):
        r.add(fid, size)
    r.tx.set_threads(1, 1)  # connections torn down and re-made mid-transfer
    r.tx.set_threads(2, 4)
    r.wait_done(range(1, len(sizes) + 1))
    for fid in range(1, len(sizes) + 1):
        r.assert_identical(fid)
    ts, rs = r.tx.stats(), r.rx.stats()
    assert rs.connections_rejected == 0 and rs.protocol_errors == 0
    assert ts.net.bytes == rs.recv.bytes == sum(sizes)  # payload bytes, not TLS records


@pytest.mark.parametrize("encrypted", [False, True])
def test_wire_carries_ciphertext_only_when_encrypted(tmp_path, engines, encrypted):
    key = os.urandom(32) if encrypted else None
    token = os.urandom(32)
    rx = te.Receiver("127.0.0.1", 0, token, CHUNK, 4 << 20, threads=1, tls_key=key)
    engines(rx)
    tap = TcpTap(rx.port)
    try:
        tx = te.Sender("127.0.0.1", tap.port, token, CHUNK, 4 << 20, threads=(1, 1), tls_key=key)
        engines(tx)
        marker = b"AUTOMDT-PLAINTEXT-MARKER-" * 4000  # ~100 KB of a recognisable pattern
        src, dst = tmp_path / "src", tmp_path / "dst"
        src.write_bytes(marker)
        fd = os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            rx.add_file(1, fd, -1, len(marker))
            tx.add_file(1, str(src), len(marker), os.stat(src).st_mtime_ns)
            wait_for(lambda: rx.stats().chunks_written == 2, what="both chunks written")
        finally:
            os.close(fd)
        assert dst.read_bytes() == marker
        with tap.lock:
            seen = bytes(tap.seen)
        assert len(seen) >= len(marker)
        assert (b"AUTOMDT-PLAINTEXT-MARKER-" in seen) is (not encrypted)
        assert (token in seen) is (not encrypted)  # the data token travels inside TLS
    finally:
        tap.close()


def test_wrong_key_or_plain_sender_refused_receiver_still_serves(rig, tmp_path, engines):
    key = os.urandom(32)
    r = rig(chunk=CHUNK, threads=(1, 1, 1), sender_kw={"tls_key": key}, receiver_kw={"tls_key": key})
    # A sender with the right token but the wrong key, and a plain one: nothing gets written.
    for bad in (os.urandom(32), None):
        tx = te.Sender("127.0.0.1", r.rx.port, r.token, CHUNK, 1 << 20, threads=(0, 1), tls_key=bad)
        engines(tx)
        wait_for(lambda: r.rx.stats().connections_rejected >= (1 if bad else 2), timeout=15,
                 what="rejected handshake")
        tx.close()
    msgs = [e[1] for e in r.rx_kind("conn_rejected")]
    assert any(m.startswith("TLS handshake with 127.0.0.1:") for m in msgs), msgs
    # A stock TLS client (certificate-based) cannot talk to it either.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", r.rx.port), timeout=5) as s:
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            with ctx.wrap_socket(s) as t:
                t.sendall(b"AMDTDATA" + r.token)
                t.recv(1)
    # the rig's own sender connects on its own time (its handshake can come after the refusals)
    wait_for(lambda: r.rx.stats().connections_total >= 1, timeout=15, what="the rig's sender connected")
    st = r.rx.stats()
    assert st.connections_total == 1 and st.chunks_written == 0  # only the rig's own sender
    # ...and the right sender still gets its file across.
    r.add(1, 5 * CHUNK + 1)
    r.wait_done([1])
    r.assert_identical(1)


def test_tls_key_validation():
    with pytest.raises(ValueError, match="tls_key"):
        te.Receiver("127.0.0.1", 0, os.urandom(32), CHUNK, 1 << 20, tls_key=b"short")
