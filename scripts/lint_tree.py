"""Lay out the installed package as links, for the tools that walk folders (mypy, import-linter).

pyproject.toml maps the top-level folders into one package (``simulator/`` is installed as
``automdt.simulator``, and so on) and the editable install resolves that mapping with an import
hook, which neither mypy nor import-linter follows. This script builds
``build/lint-tree/automdt`` from that same mapping: every entry of ``automdt/`` linked, and each
mapped folder linked under its subpackage's name. The tree is made anew on every run (a new
module needs no step of its own) and holds links only, so the tools read the real files.

    .venv/bin/python scripts/lint_tree.py [TREE]      # prints TREE
"""
from __future__ import annotations

import os
import shutil
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_dirs() -> dict[str, str]:
    """``{"automdt": "automdt", "automdt.simulator": "simulator", ...}`` from pyproject.toml."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return dict(tomllib.load(f)["tool"]["setuptools"]["package-dir"])


def build(tree: str) -> str:
    tree = os.path.abspath(tree)
    shutil.rmtree(tree, ignore_errors=True)
    dirs = package_dirs()
    for package, folder in sorted(dirs.items(), key=lambda kv: kv[0].count(".")):
        target = os.path.join(tree, *package.split("."))
        source = os.path.join(ROOT, folder)
        if "." in package:  # a mapped folder: one link, under the subpackage's name
            os.symlink(source, target)
            continue
        os.makedirs(target)
        subpackages = {p.rpartition(".")[2] for p in dirs if p.startswith(package + ".")}
        for name in os.listdir(source):
            if name not in subpackages and name != "__pycache__":
                os.symlink(os.path.join(source, name), os.path.join(target, name))
    return tree


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "lint-tree")))
