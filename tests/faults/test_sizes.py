"""Case 8: sparse files and files of 0, 1, chunk-1, chunk, chunk+1 bytes (at the default 4 MiB chunk
and a small one): content digests equal by `automdt verify` (local and against a receiver), and a
single changed byte in a tail is found."""
import os

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from automdt.receiver import ReceiverServer  # noqa: E402
from automdt.sender import run_transfer  # noqa: E402
from tests.faults.helpers import Outside, opts, temporaries  # noqa: E402
from tests.util import CHUNK, run_cli, trees_identical, write_file  # noqa: E402

MI4 = 4 << 20
SECRET = b"sizes-secret"


def _edge_sizes(c):
    return {"zero": 0, "one": 1, "c_minus_1": c - 1, "c": c, "c_plus_1": c + 1, "two_c": 2 * c, "three_c_17": 3 * c + 17}


def _sparse(path, size, pieces):
    """A file of ``size`` bytes that is a hole except for ``pieces`` [(offset, bytes)]."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, data in pieces:
            f.seek(off)
            f.write(data)


def _verify(src, dest, *extra):
    code, out, err = run_cli("verify", src, dest, "--json", *extra)
    return code, out, err


@pytest.mark.parametrize("chunk", [CHUNK, MI4], ids=["64KiB", "4MiB"])
def test_edge_sizes_have_equal_digests(make_tree, tmp_path, chunk):
    files = {f"{k}.bin": v for k, v in _edge_sizes(chunk).items()}
    src = make_tree(files)
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst])
    s = run_transfer(src, dst, opts(chunk_size=chunk, memory=4 * chunk))
    assert s.exit_code == 0, s.errors
    assert s.bytes == sum(files.values())
    assert temporaries(dst) == []
    for vchunk in {chunk, MI4, CHUNK}:  # digests agree whatever chunk size verify uses
        code, out, err = _verify(src, dst, "--chunk-size", str(vchunk))
        assert code == 0 and out["verified"] == len(files), (vchunk, out, err)
    # a single byte changed in a tail (size and mtime kept) is found
    p = os.path.join(dst, "c_plus_1.bin")
    st = os.stat(p)
    with open(p, "r+b") as f:
        f.seek(chunk)
        b = f.read(1)
        f.seek(chunk)
        f.write(bytes([b[0] ^ 1]))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    code, out, err = _verify(src, dst, "--chunk-size", str(chunk))
    assert code == errors.INTEGRITY and out["differences"] == ["differs: c_plus_1.bin"], out
    guard.check()


def test_sparse_files_have_equal_digests(tmp_path):
    src = str(tmp_path / "src")
    size = 256 << 20
    _sparse(os.path.join(src, "sparse.bin"), size,
            [(0, os.urandom(4096)), (size // 2 + 12345, os.urandom(1 << 20)), (size - 1, b"\x01")])
    _sparse(os.path.join(src, "all_hole.bin"), 5 * MI4 + 3, [])
    _sparse(os.path.join(src, "hole_at_end.bin"), 3 * MI4, [(0, os.urandom(MI4 + 1))])
    write_file(os.path.join(src, "dense.bin"), 2 * MI4 + 1, seed=1)
    assert os.stat(os.path.join(src, "sparse.bin")).st_blocks * 512 < 4 << 20  # really sparse
    dst = str(tmp_path / "dst")
    s = run_transfer(src, dst, opts(chunk_size=MI4, memory=4 * MI4, threads=(2, 2, 2)))
    assert s.exit_code == 0, s.errors
    code, out, err = _verify(src, dst)
    assert code == 0 and out["verified"] == 4, (out, err)
    ok, diff = trees_identical(src, dst)
    assert ok, diff


def test_verify_against_a_receiver_with_edge_sizes(make_tree, tmp_path):
    files = {f"{k}.bin": v for k, v in _edge_sizes(CHUNK).items()}
    files["sparse.bin"] = 0
    src = make_tree(files)
    _sparse(os.path.join(src, "sparse.bin"), 40 * CHUNK + 1, [(17 * CHUNK - 3, b"xyz")])
    root = tmp_path / "root"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)  # a secret open to others is refused
    srv = ReceiverServer(str(root), "127.0.0.1", 0, secret=SECRET).start()
    try:
        dest = f"127.0.0.1:{srv.port}/job"
        s = run_transfer(src, dest, opts(secret=SECRET))
        assert s.exit_code == 0, s.errors
        code, out, err = _verify(src, dest, "--secret-file", str(secret), "--chunk-size", str(CHUNK))
        assert code == 0 and out["verified"] == len(files), (out, err)
        os.unlink(root / "job" / "one.bin")
        code, out, err = _verify(src, dest, "--secret-file", str(secret))
        assert code == errors.INTEGRITY and out["differences"] == ["missing: one.bin"], (out, err)
    finally:
        srv.stop()


@pytest.mark.expensive
def test_large_sparse_file_has_equal_digests(tmp_path):
    """A 4 GiB file holding 1 MiB of data (the destination is written densely: ~4 GiB of disk)."""
    src = str(tmp_path / "src")
    size = 4 << 30
    _sparse(os.path.join(src, "big_sparse.bin"), size, [(size // 3, os.urandom(1 << 20)), (size - 5, b"tail!")])
    dst = str(tmp_path / "dst")
    s = run_transfer(src, dst, opts(chunk_size=MI4, memory=16 * MI4, threads=(2, 2, 2)))
    assert s.exit_code == 0, s.errors
    code, out, err = _verify(src, dst)
    assert code == 0 and out["verified"] == 1, (out, err)
