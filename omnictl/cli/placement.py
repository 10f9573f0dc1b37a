"""Where the stage processes run: the options `serve` and `bench` share (issue 11, Ray)."""

from __future__ import annotations

from typing import Annotated

import typer

Launcher = Annotated[
    str,
    typer.Option(
        "--launcher",
        metavar="local|ray|threads",
        help="local: one OS process per stage process here; ray: Ray actors placed by `node` label; "
        "threads: one thread of this process each (debugging: no process boundary, nothing killed).",
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray-address", metavar="ADDRESS", help="The Ray cluster to join with --launcher ray (default: Ray's own)."
    ),
]
DataHost = Annotated[
    str | None,
    typer.Option(
        "--data-host",
        envvar="OMNICTL_DATA_HOST",
        metavar="HOST",
        help="Address the tcp data plane binds and advertises (default: each node's address; 127.0.0.1 locally).",
    ),
]
