"""The `omnictl` command. Each subcommand lives in its own module and calls a library API;
modules import heavy dependencies inside their command functions so `--help` stays instant."""

from __future__ import annotations

from typing import Annotated

import typer

from omnictl.cli.help import CONTEXT_SETTINGS, OmnictlGroup

app = typer.Typer(
    name="omnictl",
    help="Serve multi-stage omni models from a declarative YAML topology.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    context_settings=CONTEXT_SETTINGS,
    cls=OmnictlGroup,
)


def _version(value: bool) -> None:
    if value:
        from omnictl import __version__

        typer.echo(f"omnictl {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print omnictl's version and exit."),
    ] = False,
) -> None:
    """Serve multi-stage omni models from a declarative YAML topology."""


def _register() -> None:
    from omnictl.cli import bench, models, serve, trace, validate

    for command in (validate, serve, bench, trace, models):
        command.register(app)


_register()

if __name__ == "__main__":  # pragma: no cover
    app()
