"""Shared fixtures."""
import os

import pytest

from tests.util import write_file


@pytest.fixture
def make_tree(tmp_path):
    """make_tree({relpath: size}, dirs=[...]) -> root path of a fresh source tree."""
    count = [0]

    def make(files, dirs=()):
        count[0] += 1
        root = tmp_path / f"src{count[0]}"
        root.mkdir()
        for i, (rel, size) in enumerate(sorted(files.items())):
            write_file(str(root / rel), size, seed=i)
        for d in dirs:
            (root / d).mkdir(parents=True, exist_ok=True)
        return str(root)

    return make


@pytest.fixture(scope="session", autouse=True)
def _runtime_dir(tmp_path_factory):
    """Every CLI run the tests start keeps its job lock (never deleted, by design: a stable inode
    for flock) under ``$XDG_RUNTIME_DIR/automdt``; point that at the session's temp directory so
    the suite leaves no lock files in the machine's own runtime or temp directory."""
    saved = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME")}
    os.environ["XDG_RUNTIME_DIR"] = str(tmp_path_factory.mktemp("runtime"))
    # and the per-job start history (automdt.history) under the session's temp directory too
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
