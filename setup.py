"""Build of the C transfer engine (automdt.transfer_engine._engine), and the development install.

Everything else is declared in pyproject.toml. The engine links the system xxHash library
and OpenSSL (Debian: libxxhash-dev, libssl-dev, installed by `make setup`).

A built wheel holds the packages pyproject.toml lists; the editable install that `make setup`
makes also maps experiments/ as automdt.experiments (its package-dir entry is in pyproject.toml),
so the experiments run from a checkout (`python -m automdt.experiments`) without shipping in the
wheel. Their dependencies are the `experiments` extra.
"""
import glob

from setuptools import Extension, setup
from setuptools.command.editable_wheel import editable_wheel

DEVELOPMENT_ONLY = ["automdt.experiments"]

engine = Extension(
    "automdt.transfer_engine._engine",
    sources=sorted(glob.glob("transfer_engine/src/*.c")),
    depends=sorted(glob.glob("transfer_engine/src/*.h")),
    libraries=["xxhash", "ssl", "crypto", "pthread"],
    extra_compile_args=["-O2", "-fno-omit-frame-pointer", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-pthread"],
)


class EditableWithExperiments(editable_wheel):
    """``pip install -e .``: the wheel's packages plus :data:`DEVELOPMENT_ONLY`."""

    def run(self):
        packages = list(self.distribution.packages or [])
        self.distribution.packages = packages + [p for p in DEVELOPMENT_ONLY if p not in packages]
        super().run()


setup(ext_modules=[engine] if engine.sources else [], cmdclass={"editable_wheel": EditableWithExperiments})
