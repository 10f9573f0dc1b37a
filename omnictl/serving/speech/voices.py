"""``GET /v1/audio/voices``: the voices the topology's TTS stage has installed (what
``voice`` accepts on ``/v1/audio/speech`` and in chat's ``audio.voice``).

The audio terminal's factory says which voices it has through a ``voices`` attribute, a
callable returning their names (the voice assistant's ``tts`` factory has one). OpenAI's
voice names (``alloy``, ``nova``...) are accepted too and mean the stage's default voice:
they are listed as ``aliases``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnictl.outputs import AUDIO
from omnictl.serving.chat.protocol import OPENAI_VOICES
from omnictl.serving.common.errors import error_response
from omnictl.serving.state import ServingState
from omnictl.user_code import resolve_callable


def installed_voices(topology: Any) -> list[str] | None:
    """The voices of the first audio terminal whose factory lists them; None when none does."""
    directory = topology.path.parent if getattr(topology, "path", None) is not None else None
    for name, modality in topology.terminals.items():
        if modality != AUDIO:
            continue
        voices = _voices_of(topology.stages[name].factory, directory)
        if voices is not None:
            return voices
    return None


@lru_cache(maxsize=16)
def _voices_of(factory: str, directory: Any) -> list[str] | None:
    listed = getattr(resolve_callable(factory, directory), "voices", None)
    return sorted(str(voice) for voice in listed()) if callable(listed) else None


def endpoint(state: ServingState) -> Callable[[Request], Awaitable[Response]]:
    async def voices(request: Request) -> Response:
        pipe = state.pipeline
        if pipe is None:
            return error_response(503, "the server is starting", "server_error", "starting")
        names = installed_voices(pipe.topology)
        if names is None:
            return error_response(
                404,
                f"topology {pipe.topology.name!r} does not list its voices (no audio terminal "
                "whose factory has a 'voices' attribute)",
                "invalid_request_error",
                "not_found",
            )
        data = [{"id": name, "object": "voice", "name": name} for name in names]
        return JSONResponse({"object": "list", "data": data, "aliases": sorted(OPENAI_VOICES)})

    return voices
