"""What Qwen2.5-Omni's thinker hands the talker beyond the output contract.

The talker reads, per prompt position, the thinker's last hidden state plus its input
embedding (``talker_prefix``: once, on the first output) and the same sum for each answer
token the thinker fed back (``reply``, ``[n, hidden]``): a chunk carries the rows made
since the last one, the result all of them. The talker's outputs are Qwen3-Omni's
(:class:`~omnictl.models.qwen3_omni.payloads.TalkerDelta`: ``codes`` ``[n, 1]`` here).
"""

from __future__ import annotations

from typing import Any

from omnictl.outputs import TokenDelta, TokenResult


class ThinkerDelta(TokenDelta):
    talker_prefix: Any = None  # a dict of tensors, on the request's first output only
    reply: Any = None  # [n, hidden]: rows for the answer tokens fed back since the last chunk


class ThinkerResult(TokenResult):
    talker_prefix: Any = None  # when nothing was streamed before the result
    reply: Any = None  # [completion_tokens - 1, hidden]: every row
