"""Whether this machine and user can build network-namespace test paths.

The one check behind every experiment, benchmark, script and test that makes namespaces, veth
pairs and ``tc`` qdiscs of its own (:class:`automdt.experiments.fairness.SharedLink`,
``benchmarks/netns.py``'s ``NetnsPair``, the ``net`` paths of :mod:`automdt.experiments.realpaths`).
"""
from __future__ import annotations

import os
import shutil
from typing import Tuple


def netns_available() -> Tuple[bool, str]:
    """``(True, "")`` if this process can create network namespaces, veth pairs and tc qdiscs,
    else ``(False, reason)``."""
    if os.geteuid() != 0:
        return False, "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` not found (Debian package iproute2)"
    return True, ""
