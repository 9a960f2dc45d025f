"""Option and argument values converted without pydantic when they are plainly valid.

Typer 0.29 converts every parameter's value, a missing one included (``--help`` when not given), with a pydantic
``TypeAdapter`` that it builds on first use (``typer._adapters``): pydantic's import and the adapters cost a
command ~0.3 s of CPU before it runs (issue 16: ``trajlake sql "SELECT 1"`` in < 0.5 s). ``convert_plainly`` makes
every Typer parameter start with a converter that takes the plain cases itself (no value; text; a value of an
Enum's choices, matched as Typer matches it; an integer in digits within the option's bounds) and hands every other
value, a bad one included, to Typer's own converter, so that values and error messages stay Typer's. It replaces
Typer's private ``_TyperParameter.get_runtime_param`` (help and completion options are made while a command parses,
so no instance can be reached earlier): typer is pinned in pyproject.toml, and tests/trajlake/test_cli_coercion.py
fails when that method or the values change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from typer._click import Context
from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
from typer._param_types import coerce_cli_choice
from typer.core import _TyperParameter

_TYPER = object()
"""``_plain_value``'s answer for a value only Typer's converter may judge."""
_DIGITS = re.compile(r"-?[0-9]{1,18}")


@dataclass(frozen=True)
class PlainRuntimeParam(RuntimeParam):
    """Typer's conversion of one parameter, without pydantic for plain values."""

    descriptor: TypeDescriptor

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        plain = _plain_value(self.descriptor, value, ctx)
        if plain is not _TYPER:
            return plain
        return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)


def convert_plainly() -> None:
    """Every Typer parameter whose converter is not built yet starts with the plain one (idempotent)."""
    _TyperParameter.get_runtime_param = _plain_runtime_param


def _plain_runtime_param(param: _TyperParameter) -> RuntimeParam:
    if param._runtime_param is None:
        descriptor = param.type_descriptor
        param._runtime_param = (build_runtime_param(descriptor) if descriptor.file_annotation is not None else
                                PlainRuntimeParam(descriptor.parameter_info, descriptor.annotation, descriptor))
    return param._runtime_param


def _plain_value(descriptor: TypeDescriptor, value: Any, ctx: Context) -> Any:
    """``value`` converted as Typer converts it, or ``_TYPER`` when that is not plain."""
    info, annotation = descriptor.parameter_info, descriptor.annotation
    if info.parser is not None:
        return _TYPER
    if annotation is str and type(value) is str:
        return value
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        try:
            return coerce_cli_choice(value, choices=tuple(annotation), case_sensitive=info.case_sensitive, ctx=ctx)
        except ValueError:
            return _TYPER
    if annotation is int and not info.clamp:
        if isinstance(value, str) and _DIGITS.fullmatch(value):
            number = int(value)
        elif type(value) is int:
            number = value
        else:
            return _TYPER
        if (info.min is None or number >= info.min) and (info.max is None or number <= info.max):
            return number
    return _TYPER
