"""What the model families' pipeline parity tests (tests/models/*/test_pipeline.py) do alike.

A family's test runs its shipped topology on the real runtime and compares what it makes
with transformers' own on the same tiny checkpoint. The client only hears audio, so the test
adds a terminal showing one stage's result (:func:`with_result_terminal`); and each checks
the same three things of a served request (:func:`served_then_aborted`): its audio streamed
before it completed, and an abort after the first audio leaves nothing held.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnictl.request import RequestEventKind, RequestState
from omnictl.topology.validation import loads
from tests.support.held import held_by


def with_result_terminal(topology: Path, *, after: str, name: str, process: str) -> Any:
    """``topology`` (a shipped YAML file), plus a terminal ``name`` in ``process`` that returns the
    result of the stage whose ``next:`` line is ``after`` (e.g. ``"next: [mimi_decoder]"``),
    as modality ``codes``. (Moshi's test can take it too: its line is ``next: [mimi_decoder, text]``.)"""
    text = topology.read_text()
    old = f"    {after}\n"
    assert text.count(old) == 1, f"{topology}: {after!r} is not one line of the topology"
    text = text.replace(old, f"    {after[: -len(']')]}, {name}]\n")
    text += (
        f"\n  - name: {name}\n    factory: omnictl.models.examples.identity\n    process: {process}\n"
        "    terminal: true\n    modality: codes\n"
    )
    return loads(text, str(topology))


@dataclass
class Served:
    request_id: str
    result: dict[str, Any]
    events: list[Any]
    early: bool  # a stream event came while the request was still running
    held: list[str]  # what the pipeline still holds after the aborted request


async def served_then_aborted(pipe: Any, request: dict[str, Any], long_request: dict[str, Any]) -> Served:
    """Submit ``request`` and read all its events and its result, then submit ``long_request`` and
    abort it at its first stream event; what ``pipe`` holds after."""
    submitted = await pipe.submit(request)
    events, early = [], False
    async for event in submitted.events():
        events.append(event)
        if event.kind is RequestEventKind.STREAM and submitted.state is RequestState.RUNNING:
            early = True
    result = await submitted.result()
    aborted = await pipe.submit(long_request)
    async for event in aborted.events():
        if event.kind is RequestEventKind.STREAM:
            await pipe.abort(aborted.id)
            break
    return Served(submitted.id, result, events, early, await held_by(pipe))
