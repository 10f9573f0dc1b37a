"""The `omnictl` command. Each subcommand lives in its own module and calls a library API;
modules import heavy dependencies inside their command functions so `--help` stays instant."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="omnictl",
    help="Serve multi-stage omni models from a declarative YAML topology.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Serve multi-stage omni models from a declarative YAML topology."""


def _register() -> None:
    from omnictl.cli import bench, serve, trace, validate

    for command in (validate, serve, bench, trace):
        command.register(app)


_register()

if __name__ == "__main__":  # pragma: no cover
    app()
