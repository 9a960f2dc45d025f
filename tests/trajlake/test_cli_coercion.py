"""``trajlake.coercion``: option values converted without pydantic are the values Typer's converter gives, and a
value it does not take plainly reaches Typer's converter (so errors read the same)."""

from __future__ import annotations

import enum
from pathlib import Path

import pytest
import typer
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param
from typer.core import _TyperParameter

from trajlake.cli import build_app
from trajlake.coercion import PlainRuntimeParam, _plain_runtime_param, convert_plainly


class Color(str, enum.Enum):
    red = "red"
    green = "Green"


def command() -> typer.core.TyperCommand:
    app = typer.Typer()

    @app.command()
    def probe(
        text: str = typer.Argument(...),
        maybe: str | None = typer.Option(None),
        color: Color = typer.Option(Color.red),
        loose: Color = typer.Option(Color.red, case_sensitive=False),
        count: int = typer.Option(3),
        at_least: int | None = typer.Option(None, min=0, max=100),
        clamped: int = typer.Option(1, min=0, max=5, clamp=True),
        ratio: float = typer.Option(0.5),
        path: Path | None = typer.Option(None),
        flag: bool = typer.Option(False),
    ) -> None:
        """A command with one parameter of each kind."""

    app.command()(lambda: None)  # a second command: typer keeps ``probe`` a named subcommand
    return typer.main.get_group(app).commands["probe"]


VALUES = ["x", "", " 5", "5", "0", "-1", "-0", "007", "101", "1_000", "+3", "5.0", "1e3", "many", "red", "RED",
          "green", "Green", "purple", "true", "0.25", "/tmp/a", Color.red, 7, True]


def converted(runtime, param: _TyperParameter, ctx: Context, value: object) -> tuple[str, object]:
    try:
        return "value", runtime.coerce(value, param=param, ctx=ctx)
    except BadParameter as exc:
        return "error", exc.format_message()


@pytest.mark.parametrize("name", ["text", "maybe", "color", "loose", "count", "at_least", "clamped", "ratio", "path",
                                  "flag"])
def test_plain_values_are_typers_values(name):
    cmd = command()
    param = next(p for p in cmd.params if p.name == name)
    ctx = Context(cmd)
    typer_way = build_runtime_param(param.type_descriptor)
    plain = PlainRuntimeParam(param.type_descriptor.parameter_info, param.type_descriptor.annotation,
                              param.type_descriptor)
    for value in [*VALUES, None]:
        want, got = converted(typer_way, param, ctx, value), converted(plain, param, ctx, value)
        assert got == want and type(got[1]) is type(want[1]), (name, value)


def test_the_shell_installs_the_plain_converter():
    """Typer's private hook is where convert_plainly expects it: a parameter's converter is built by
    ``get_runtime_param``, and after the shell exists that is the plain one."""
    typer.main.get_command(build_app())
    convert_plainly()
    assert _TyperParameter.get_runtime_param is _plain_runtime_param
    param = next(p for p in command().params if p.name == "count")
    assert param._runtime_param is None
    assert isinstance(param.get_runtime_param(), PlainRuntimeParam)
