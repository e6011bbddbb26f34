"""Shared fixtures."""
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

