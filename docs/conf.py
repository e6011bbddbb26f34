"""Sphinx configuration of the AutoMDT documentation (``make docs``).

Sphinx with the furo theme and MyST Markdown, the stack of Gymnasium and stable-baselines3: the
pages are Markdown, the CLI reference and the man page come from the argparse parser
(sphinx-argparse), the notebooks are rendered from committed outputs (myst-nb, never executed
here), and the tables of figures are generated from results files by the local extension
``_ext/automdt_docs.py``.
"""
from __future__ import annotations

import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, os.path.join(DOCS, "_ext"))

from automdt import __version__  # noqa: E402

project = "AutoMDT"
author = "The AutoMDT developers"
copyright = "AutoMDT developers, BSD-3-Clause"
try:  # the checkout's own version (the installed _version.py is as old as the last install)
    from setuptools_scm import get_version

    release = get_version(root=ROOT)
except Exception:  # no git metadata or no setuptools-scm: what the install says
    release = __version__
version = release.split("+")[0]

extensions = [
    "sphinx.ext.autodoc",   # the API reference (docs/api.md) from the docstrings
    "myst_nb",              # MyST Markdown pages and .ipynb notebooks (implies myst_parser)
    "sphinxarg.ext",        # the argparse directive: the CLI reference from automdt.cli.build_parser()
    "automdt_docs",         # generated tables: exit codes, results files, schema fields
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "tools", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 3
# option names stay `--name`, never an en dash
smartquotes = False

# Notebooks are rendered from the outputs committed in docs/notebooks/ (`make notebooks-render`
# executes them once); the docs build never runs a kernel.
nb_execution_mode = "off"
nb_merge_streams = True

html_theme = "furo"
html_title = f"AutoMDT {release}"
html_static_path = ["_static"]
html_theme_options = {"navigation_with_keys": True}

# `make docs` runs with -W -n: every warning is an error, every reference must resolve.
nitpicky = True
# the API reference: signatures without type hints (the docstrings say what each parameter is)
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_inherit_docstrings = False  # gymnasium's own method docstrings refer to its own pages
suppress_warnings: list[str] = []

# automdt(1): the CLI reference page, as a man page (`make docs` -> docs/_build/man/automdt.1)
man_pages = [("man", "automdt", "modular data transfers with jointly tuned thread pools", [author], 1)]
man_show_urls = False

