"""Build of the C transfer engine (automdt.transfer_engine._engine).

Everything else is declared in pyproject.toml. The engine links the system xxHash library
and OpenSSL (Debian: libxxhash-dev, libssl-dev, installed by `make setup`).
"""
import glob

from setuptools import Extension, setup

engine = Extension(
    "automdt.transfer_engine._engine",
    sources=sorted(glob.glob("transfer_engine/src/*.c")),
    depends=sorted(glob.glob("transfer_engine/src/*.h")),
    libraries=["xxhash", "ssl", "crypto", "pthread"],
    extra_compile_args=["-O2", "-fno-omit-frame-pointer", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-pthread"],
)

setup(ext_modules=[engine] if engine.sources else [])
