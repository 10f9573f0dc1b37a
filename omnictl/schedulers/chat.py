"""Chat messages as a model's chat template takes them, and the stage's system prompt.

Both engines' text stages (the HF runner, :mod:`omnictl.models.hf_causal_lm`, and the vLLM
scheduler, :mod:`omnictl.schedulers.vllm_engine`) read a request's ``messages`` through
:func:`text_messages` and put a stage's default system prompt first through
:func:`with_system_prompt`, so the two engines render the same prompt.
"""

from __future__ import annotations

from typing import Any, Mapping

from omnictl.exceptions import InvalidRequest


def text_messages(messages: Any) -> list[dict[str, str]]:
    """Chat messages with string content (text parts joined), as chat templates expect."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("model input: messages must be a non-empty list", field="messages")
    rendered = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"messages[{index}]: expected an object with a role", field=f"messages[{index}]")
        content = message.get("content", "")
        if isinstance(content, list):
            texts = []
            for part_index, part in enumerate(content):
                if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise InvalidRequest(
                        f"messages[{index}].content[{part_index}]: this model reads text parts only",
                        field=f"messages[{index}].content[{part_index}]",
                    )
                texts.append(part["text"])
            content = "".join(texts)
        elif not isinstance(content, str):
            raise InvalidRequest(f"messages[{index}].content: expected text", field=f"messages[{index}].content")
        rendered.append({"role": message["role"], "content": content})
    return rendered


def with_system_prompt(messages: Any, system_prompt: str | None) -> Any:
    """``messages`` with ``system_prompt`` first, unless it is empty or the caller set one."""
    if not system_prompt or not isinstance(messages, list):
        return messages
    if any(isinstance(m, Mapping) and m.get("role") == "system" for m in messages):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]
