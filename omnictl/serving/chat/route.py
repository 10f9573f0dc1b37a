"""``POST /v1/chat/completions``: parse the envelope, admit the request, answer it whole or streamed."""

from __future__ import annotations

from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from omnictl.serving.chat.protocol import parse_chat_body
from omnictl.serving.common.eventstream import EventStreamResponse
from omnictl.serving.common.intake import Admitted, Submission, admit
from omnictl.serving.common.tracking import complete, stream_response
from omnictl.serving.state import PipelineLike, ServingState


def endpoint(state: ServingState) -> Callable[[Request], Awaitable[Response | EventStreamResponse]]:
    async def parse_chat(request: Request, raw: bytes, pipe: PipelineLike) -> Submission[bool]:
        # JSON, envelope and messages; input audio is decoded here, once (off the loop when large)
        parsed = await parse_chat_body(raw, pipe.topology.terminals, state.limits)
        return Submission(
            parsed.inputs, parsed.modalities, parsed.model, parsed.stream, parsed.audio_format, stream=parsed.stream
        )

    async def chat_completions(request: Request) -> Response | EventStreamResponse:
        admitted = await admit(state, request, parse_chat)
        if not isinstance(admitted, Admitted):
            return admitted
        if admitted.submission.extra:  # stream
            return stream_response(admitted.tracked, admitted.pipeline.abort)
        return await complete(admitted.tracked, request, admitted.pipeline.abort)

    return chat_completions
