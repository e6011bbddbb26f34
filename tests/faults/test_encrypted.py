"""The encrypted path (--encrypt): CURVE control channel + TLS data connections.

Nothing readable on either wire, tampering caught by TLS and resent, mismatched settings
refused with nothing created, and the receiver keeps serving."""
import os

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

import zmq  # noqa: E402

from automdt import errors, protocol  # noqa: E402
from automdt.errors import AutomdtError  # noqa: E402
from automdt.receiver import ReceiverServer  # noqa: E402
from automdt.sender import run_transfer  # noqa: E402
from tests.faults.chaos import ChaosProxy, Plan  # noqa: E402
from tests.faults.helpers import Outside, final_files, opts, temporaries  # noqa: E402
from tests.util import CHUNK, TcpTap, run_cli, trees_identical  # noqa: E402

SECRET = b"encrypted-path-secret"
MARKER = b"PLAINTEXT-MARKER-"
FILES = {"secret-name-a.bin": 9 * CHUNK + 5, "dir/secret-name-b.bin": 3 * CHUNK}


@pytest.fixture
def enc_server(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    srv = ReceiverServer(str(root), "127.0.0.1", 0, secret=SECRET, encrypt=True, idle_timeout_s=30).start()
    guard = Outside(tmp_path, [str(root)], allow_new=("src",))
    try:
        yield srv, root
    finally:
        srv.stop()
    guard.check()


def _marked_tree(make_tree):
    src = make_tree(FILES)
    for rel, size in FILES.items():  # a recognisable pattern a tap could find in cleartext
        with open(os.path.join(src, rel), "wb") as f:
            f.write((MARKER * (size // len(MARKER) + 1))[:size])
    return src


def test_nothing_readable_on_either_wire_and_tree_identical(enc_server, make_tree):
    srv, root = enc_server
    src = _marked_tree(make_tree)
    data_tap = {}

    def hook(host, port):
        data_tap["tap"] = TcpTap(port)
        return "127.0.0.1", data_tap["tap"].port

    ctl_tap = TcpTap(srv.port)
    try:
        s = run_transfer(src, f"127.0.0.1:{ctl_tap.port}/out",
                         opts(secret=SECRET, encrypt=True, data_endpoint_hook=hook))
    finally:
        ctl_tap.close()
        if "tap" in data_tap:
            data_tap["tap"].close()
    assert s.exit_code == 0, s.errors
    assert s.encrypted
    assert trees_identical(src, str(root / "out"))[0]
    ctl, data = bytes(ctl_tap.seen), bytes(data_tap["tap"].seen)
    assert len(data) > sum(FILES.values())  # everything went through the tap, plus TLS overhead
    assert MARKER not in data
    assert b"secret-name" not in ctl and b"manifest" not in ctl  # names and message types hidden


def test_plain_control_channel_shows_names_without_encrypt(tmp_path, make_tree):
    """The counter-check of the test above: the same tap sees names on a plain session."""
    root = tmp_path / "plainroot"
    root.mkdir()
    srv = ReceiverServer(str(root), "127.0.0.1", 0, secret=SECRET).start()
    src = _marked_tree(make_tree)
    tap = TcpTap(srv.port)
    try:
        s = run_transfer(src, f"127.0.0.1:{tap.port}/out", opts(secret=SECRET))
    finally:
        tap.close()
        srv.stop()
    assert s.exit_code == 0 and not s.encrypted
    assert b"secret-name" in bytes(tap.seen)


def test_flipped_ciphertext_byte_drops_the_connection_and_the_chunk_is_resent(enc_server, make_tree):
    srv, root = enc_server
    src = _marked_tree(make_tree)
    # byte 3000 of the first two connections: inside the first TLS records after the handshake
    with ChaosProxy([Plan("flip", at=3000)] * 2) as px:
        s = run_transfer(src, f"127.0.0.1:{srv.port}/out",
                         opts(secret=SECRET, encrypt=True, data_endpoint_hook=px.hook))
    assert px.fired >= 1
    assert s.exit_code == 0, s.errors
    assert trees_identical(src, str(root / "out"))[0]
    assert temporaries(str(root / "out")) == []


@pytest.mark.parametrize("sender_encrypts", [False, True])
def test_mismatched_settings_are_refused_and_nothing_is_created(tmp_path, make_tree, sender_encrypts):
    root = tmp_path / "root"
    root.mkdir()
    # one end encrypts, the other does not: the CURVE handshake cannot complete
    srv = ReceiverServer(str(root), "127.0.0.1", 0, secret=SECRET, encrypt=not sender_encrypts).start()
    try:
        src = make_tree(FILES)
        s = run_transfer(src, f"127.0.0.1:{srv.port}/out",
                         opts(secret=SECRET, encrypt=sender_encrypts, timeout_s=2, retries=0))
        # not retryable (the settings will still differ): exit 7 at once, saying which end lacks it
        assert s.exit_code == errors.FATAL and s.attempts == 1
        assert ("it does not use --encrypt" if sender_encrypts else "it requires --encrypt") in s.errors[-1]
        assert final_files(str(root)) == {}
    finally:
        srv.stop()


def test_encrypted_control_channel_cannot_open_a_plain_session(enc_server):
    """A sender that speaks CURVE but asks for a plain data path is refused before any file."""
    srv, root = enc_server
    ctx = zmq.Context()
    try:
        c = protocol.ControlClient(ctx, "127.0.0.1", srv.port, timeout_s=5, curve_secret=SECRET)
        cn = protocol.nonce()
        ch = c.request({"type": "hello", "version": protocol.VERSION, "nonce": cn})
        c.request({"type": "auth", "mac": protocol.mac(SECRET, "client", ch["nonce"], cn)})
        with pytest.raises(AutomdtError, match="requires encryption"):
            c.request({"type": "open", "subdir": "x", "chunk_size": CHUNK, "memory": 1 << 20, "encrypt": False})
        c.close()
    finally:
        ctx.term()
    assert os.listdir(root) == []


def test_cli_encrypt_needs_a_secret(tmp_path):
    (tmp_path / "src").mkdir()
    code, _, err = run_cli("transfer", str(tmp_path / "src"), "127.0.0.1:1/x", "--encrypt", "--no-lock")
    assert code == errors.USAGE
    assert err.strip().splitlines()[-1].endswith("--encrypt needs --secret-file (the keys derive from the shared secret)")
    assert "Traceback" not in err
    code, _, err = run_cli("receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path), "--encrypt")
    assert code == errors.USAGE and "--encrypt needs --secret-file" in err and "Traceback" not in err
