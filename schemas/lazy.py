"""Package re-exports that load on first use, so importing one light module of a package (every command imports
``schemas.errors``; the shell imports ``api.config``) does not import every heavy sibling."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, modules: Mapping[str, tuple[str, ...]]) -> tuple[Callable[[str], Any], list[str]]:
    """``(__getattr__, __all__)`` for ``package``: each name loads from its module when first asked for.

    >>> __getattr__, __all__ = lazy_exports(__name__, {"schemas.errors": ("InputError",)})  # doctest: +SKIP
    """
    exports = {name: module for module, names in modules.items() for name in names}

    def getattr_(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(exports[name]), name)

    return getattr_, sorted(exports)
