"""Lazy imports (standard library only).

Lazy package attributes: a package names where each public name lives, and the submodule is
imported on first use (PEP 562), so importing the package costs nothing (``automdt.agents`` and
``automdt.simulator`` use it; the transfer path never pays for numpy, torch or gymnasium it does
not touch). Optional dependencies: a command that needs a package of an install extra
(:data:`EXTRAS`) checks for it first and says in one line which extra to install (exit 2).
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


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


# ------------------------------------------------------------------ optional dependencies
EXTRAS: Dict[str, str] = {
    "torch": "train",
    "stable_baselines3": "train",
    "gymnasium": "train",
    "matplotlib": "train",
    "optuna": "sweeps",
    "submitit": "sweeps",
    "tensorboard": "sweeps",
    "pandas": "experiments",
}
"""The install extra (``pip install 'automdt[EXTRA]'``) that brings each optional top-level
package. The base install is what the transfer path needs; ``train`` adds the training stack
(``train``, ``tune``, the Gymnasium environments; matplotlib draws ``train``'s learning curve),
``sweeps`` Optuna, submitit and TensorBoard, ``experiments`` what the experiments and notebooks
of a checkout use besides."""


def missing_extra_message(modules: Sequence[str], what: str) -> Optional[str]:
    """One line naming the extras to install when any of ``modules`` (top-level names of
    :data:`EXTRAS`) cannot be imported, else None. Looks the modules up without importing them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    extras = ",".join(dict.fromkeys(EXTRAS.get(m, "train") for m in missing))
    return f"{what} needs {', '.join(missing)}, which this install lacks: pip install 'automdt[{extras}]'"


def require(modules: Sequence[str], what: str) -> None:
    """Raise :class:`automdt.errors.AutomdtError` (exit 2) naming the extra to install when any of
    ``modules`` is not installed (see :func:`missing_extra_message`)."""
    message = missing_extra_message(modules, what)
    if message is not None:
        from automdt.errors import USAGE, AutomdtError

        raise AutomdtError(message, USAGE)


def need(module: str, what: str = "this") -> Any:
    """``importlib.import_module(module)``, or :func:`require`'s one-line error (exit 2) when its
    package is not installed."""
    require([module.split(".")[0]], what)
    return importlib.import_module(module)


def extra_of(error: ImportError) -> Optional[str]:
    """The extra that brings the module a :class:`ModuleNotFoundError` names (None if no extra
    does): for a last one-line error where an optional import was not checked beforehand."""
    name = getattr(error, "name", None) or ""
    return EXTRAS.get(name.split(".")[0])
