"""Lazy package attributes (standard library only): a package names where each public name
lives, and the submodule is imported on first use (PEP 562), so importing the package costs
nothing (``automdt.agents`` and ``automdt.simulator`` use it; the transfer path never pays for
numpy, torch or gymnasium it does not touch)."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Tuple


def lazy_attributes(package: str, where: Dict[str, str], namespace: Dict[str, Any]
                    ) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``where`` maps a name to its submodule; a
    resolved name is cached in ``namespace`` (the package's globals)."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> List[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
