"""What Qwen3-Omni's stages hand each other beyond the output contract.

The thinker's first output also carries ``talker_prefix`` (the prompt ids and the
thinker's hidden states the talker starts from); the talker's outputs carry the codec
frames finished so far (``codes``) for ``code2wav`` and, in its result, the spoken
``transcript``. They extend the autoregressive scheduler's own types, so each is still a
``TextDelta`` / ``TextResult`` and crosses processes as itself.
"""

from __future__ import annotations

from typing import Any

import msgspec

from omnictl.outputs import TokenDelta, TokenResult


class ThinkerDelta(TokenDelta):
    talker_prefix: Any = None  # a dict of tensors, on the request's first output only


class ThinkerResult(TokenResult):
    talker_prefix: Any = None  # when nothing was streamed before the result


class TalkerDelta(TokenDelta):
    codes: Any = None  # [frames, groups] long tensor: the frames finished since the last chunk


class TalkerResult(TokenResult):
    codes: Any = None  # every frame of the answer (code2wav decodes what it has not yet)
    transcript: str = ""  # the text the talker spoke


def extend(data: TokenDelta | TokenResult, delta: type, result: type, **extra: Any) -> Any:
    """``data`` as ``delta`` (a chunk) or ``result`` (a result) with ``extra`` fields set."""
    cls = result if isinstance(data, TokenResult) else delta
    return cls(**msgspec.structs.asdict(data), **extra)
