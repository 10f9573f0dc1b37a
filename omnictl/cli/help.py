"""Help that reads as a manual: options show their metavar (``N``, ``URL``), flags and
arguments show no value type at all, never a Python type name (``<bool>``, ``<list[Path]>``);
the usage line writes arguments as manuals do (``FILE...`` required, ``[TOPOLOGY]``
optional), not Typer's ``{FILE}...``."""

from __future__ import annotations

from typing import Any

import typer
import typer.core

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def _no_type(ctx: Any) -> str | None:
    return None


def _usage_name(argument: Any) -> str:
    """An argument on the usage line: ``NAME`` when required, ``[NAME]`` when not, ``...``
    after it when it takes several."""
    raw = argument.display_name_raw
    name = raw if argument.required else f"[{raw}]"
    # a metavar may say it already (validate's FILE..., as the help's argument panel shows it)
    return name + ("..." if argument.nargs != 1 and not raw.endswith("...") else "")


def _plain(param: Any) -> Any:
    # An argument's metavar already names it; a flag takes no value.
    if param is not None and (isinstance(param, typer.core.TyperArgument) or getattr(param, "is_flag", False)):
        param.display_type_rich = _no_type
    if isinstance(param, typer.core.TyperArgument):
        # Typer writes a required one as {NAME}; its method, replaced on this instance only
        param._usage_display_name = lambda: _usage_name(param)  # type: ignore[method-assign]  # per instance, on purpose
    return param


class OmnictlCommand(typer.core.TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return [_plain(param) for param in super().get_params(ctx)]


class OmnictlGroup(typer.core.TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return [_plain(param) for param in super().get_params(ctx)]


def command(app: typer.Typer, name: str) -> Any:
    """``app.command(name)`` with omnictl's help conventions."""
    return app.command(name, cls=OmnictlCommand, context_settings=CONTEXT_SETTINGS)
