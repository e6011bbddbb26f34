"""Command-line parsing and receiver path safety (pure Python, no engine)."""
import os

import pytest

from automdt import errors
from automdt.paths import SafeRoot, UnsafePath, check_relpath, temp_names
from automdt.units import parse_hostport, parse_size, parse_threads, parse_throttle


def test_sizes_use_powers_of_1000_and_1024():
    assert parse_size("40M") == 40_000_000
    assert parse_size("1.5G") == 1_500_000_000
    assert parse_size("4Mi") == 4 * 1024 * 1024
    assert parse_size("512") == 512
    with pytest.raises(ValueError, match="bad size"):
        parse_size("lots")


def test_throttle_spec_any_subset():
    t = parse_throttle("read.thread=40M,net.total=400M,write.thread=120K")
    assert t["read"] == (40e6, 0.0)
    assert t["net"] == (0.0, 400e6)
    assert t["write"] == (120e3, 0.0)
    assert parse_throttle("") == {"read": (0.0, 0.0), "net": (0.0, 0.0), "write": (0.0, 0.0)}
    for bad in ("disk.thread=1M", "read=1M", "read.thread", "read.speed=1M"):
        with pytest.raises(ValueError, match="bad throttle"):
            parse_throttle(bad)


def test_threads_and_addresses():
    assert parse_threads("2,8,3") == (2, 8, 3)
    for bad in ("2,8", "a,b,c", "0,1,1"):
        with pytest.raises(ValueError):
            parse_threads(bad)
    assert parse_hostport("127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert parse_hostport("[::1]:7") == ("::1", 7)
    with pytest.raises(ValueError):
        parse_hostport("localhost")


@pytest.mark.parametrize("name", [
    "../x", "../../etc/passwd", "/etc/passwd", "a/../../x", "..", ".", "", "a//b", "a/./b", "a\x00b",
    "x" * 256, "a/" * 2100 + "b", ".amdt-0123.part",
])
def test_hostile_names_refused(name):
    with pytest.raises(UnsafePath):
        check_relpath(name)


def test_good_names_pass():
    assert check_relpath("a b/ünïcødé/ファイル.txt") == ("a b", "ünïcødé", "ファイル.txt")
    assert check_relpath(".hidden/x") == (".hidden", "x")
    assert temp_names("a/b")[0].startswith(".amdt-") and temp_names("a/b") != temp_names("a/c")


def test_safe_root_refuses_symlinked_directories(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "sub")
    with SafeRoot(str(root)) as sr:
        with pytest.raises(UnsafePath, match="symlink"):
            sr.dir_fd(("sub", "x"))
        fd = sr.dir_fd(("real", "deep"))
        assert os.path.isdir(root / "real" / "deep")
        assert fd >= 0
    assert list(outside.iterdir()) == []


def test_worst_exit_code_wins():
    assert errors.worst([]) == 0
    assert errors.worst([errors.FILES_FAILED, errors.INTEGRITY]) == errors.INTEGRITY
    assert errors.worst([errors.SOURCE_CHANGED, errors.FATAL]) == errors.FATAL
