"""What a server is configured with: one frozen value made of parts, built once and passed whole.

``omnictl serve`` maps its options onto a :class:`ServeConfig`; :func:`omnictl.serving.serve`,
:func:`~omnictl.serving.server.run_server` and
:class:`~omnictl.serving.background.BackgroundServer` take it whole. Its parts: ``launch``
(the pipeline's :class:`~omnictl.launch_config.LaunchConfig`, handed to
:meth:`omnictl.Pipeline.launch` as it is), ``http`` (where it listens and who may call it)
and ``limits`` (what one client may send or hold).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from omnictl.admission import DEFAULT_MAX_IN_FLIGHT
from omnictl.launch_config import AdmissionConfig, LaunchConfig
from omnictl.serving.chat.protocol import Limits

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

    from omnictl.launch_config import LaunchOptions


def serving_launch() -> LaunchConfig:
    """A server's launch defaults: the Python API's, with admission control on (a server
    refuses a burst at the door, 429, rather than queueing it in the stages)."""
    return LaunchConfig(admission=AdmissionConfig(max_in_flight=DEFAULT_MAX_IN_FLIGHT))


@dataclass(frozen=True)
class HttpConfig:
    """Where the server listens and who may call it."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the ready callback gets the real one)
    api_key: str | None = None  # required as 'Authorization: Bearer KEY'; None: no authentication
    served_model_names: tuple[str, ...] = ()  # model ids accepted besides the topology's name
    # Browser origins (scheme://host[:port]) allowed to open /v1/realtime or send requests
    # besides the server's own; "*": any (see omnictl.serving.common.guard).
    allowed_origins: tuple[str, ...] = ()
    # Host header values accepted besides the bound address and loopback names; "*": any.
    allowed_hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``omnictl serve`` is told, by part."""

    topology: str | Path | None = None  # None: the embedded voice assistant
    http: HttpConfig = field(default_factory=HttpConfig)
    launch: LaunchConfig = field(default_factory=serving_launch)
    limits: Limits = field(default_factory=Limits)
    # Admission by continuity (the server's, before the pipeline's): refuse a new audio
    # request (429) when the streams playing would underrun by more than this many ms if
    # it were admitted; None: off.
    max_underrun_ms: float | None = None
    # A topology whose entry takes a streamed input and streams each confirmed word (a
    # `transcript` terminal; the asr_stream stage): launched beside the served one, it
    # transcribes realtime turns while they are spoken (docs/serving.md, "Transcribed while
    # spoken"). None: each committed turn is transcribed whole.
    live_transcriber: str | Path | None = None

    def launching(self, **changes: Unpack[LaunchOptions]) -> ServeConfig:
        """A copy whose ``launch`` has ``changes`` (the flat names
        :meth:`omnictl.Pipeline.launch` takes, checked as there)."""
        return dataclasses.replace(self, launch=self.launch.replace(**changes))
