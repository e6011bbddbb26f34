"""The engine's XXH3-64 (AVX2 build of the system header, or libxxhash) matches python-xxhash."""
from __future__ import annotations

import os

import pytest

from .conftest import te  # noqa: F401  (skips when the engine is not built)
from automdt.transfer_engine import _engine


def test_hash_implementations_agree():
    xxhash = pytest.importorskip("xxhash")
    impls = ["", "libxxhash"] + (["xxh3-avx2"] if _engine.HASH_IMPL == "xxh3-avx2" else [])
    sizes = list(range(0, 260)) + [1023, 1024, 4096 + 1, 65536 - 1, (1 << 20) + 13]
    for n in sizes:
        data = os.urandom(n)
        want = xxhash.xxh3_64_intdigest(data)
        for impl in impls:
            assert _engine.hash64(data, impl) == want, (n, impl)
    with pytest.raises(ValueError):
        _engine.hash64(b"x", "md5")
