"""Which endpoints a topology can serve, derived from its shape (nothing is declared twice).

* chat completions and ``/v1/realtime``: a ``text`` or an ``audio`` terminal.
* ``/v1/realtime`` transcription sessions alone (``?intent=transcription``): a ``transcript``
  terminal and neither a ``text`` nor an ``audio`` one (Qwen3-ASR): each committed turn is
  transcribed by the topology, and a conversation (``realtime``) session is refused, since
  nothing there answers.
* ``/v1/audio/speech``: an entry stage with a ``route_fn`` that can send data straight to
  an ``audio`` terminal; it routes an :class:`omnictl.inputs.SpeechRequest` there (no
  recognition, no LLM). An entry that fans out to every branch (no ``route_fn``) does
  not choose, so it is not taken to understand speech requests.
  A topology whose every terminal is ``audio`` (a speech synthesizer end to end, CSM)
  serves it too: its entry takes text to speak, whatever path it sends it down.
* ``/v1/audio/transcriptions``: a ``transcript`` terminal (an
  :class:`omnictl.outputs.Transcript`); a request for that modality alone is pruned to
  the stages that lead to it. ``/v1/audio/translations`` too: the same recognizer, asked
  for its translate task.
* full duplex (``/v1/realtime`` in its duplex mode, :mod:`omnictl.serving.realtime.duplex`):
  an entry stage that takes the caller's audio as one session-long stream
  (:data:`SESSION_AUDIO_ENTRIES`: Moshi listens while it speaks) and an ``audio``
  terminal. Such a topology serves no chat completions: its input never arrives whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omnictl.outputs import AUDIO, TEXT, TRANSCRIPT

# Entry factories that take the caller's audio as one stream for the whole session (a request
# opened with input_stream=True), the mark of a full-duplex topology.
SESSION_AUDIO_ENTRIES = frozenset({"omnictl.models.mimi.stages.stream_encoder"})


@dataclass(frozen=True)
class Capabilities:
    chat: bool
    speech: bool
    transcription: bool
    full_duplex: bool = False

    @property
    def realtime(self) -> bool:
        """Some ``/v1/realtime`` session opens: a conversation, a transcription or a full-duplex one."""
        return self.chat or self.full_duplex or self.transcription

    @property
    def conversation(self) -> bool:
        """A ``realtime`` (conversation) session is answered: a text or audio terminal, in turns."""
        return self.chat

    def endpoints(self) -> list[str]:
        served = [
            ("/v1/chat/completions", self.chat),
            ("/v1/realtime", self.realtime),
            ("/v1/audio/speech", self.speech),
            ("/v1/audio/transcriptions", self.transcription),
            ("/v1/audio/translations", self.transcription),
        ]
        return [path for path, ok in served if ok]


def capabilities(topology: Any) -> Capabilities:
    modalities = set(topology.terminals.values())
    entry = topology.stages[topology.entry]
    speech = modalities == {AUDIO} or (
        entry.route_fn is not None and any(topology.terminals.get(target) == AUDIO for target in entry.next)
    )
    if entry.factory in SESSION_AUDIO_ENTRIES and AUDIO in modalities:
        return Capabilities(chat=False, speech=False, transcription=False, full_duplex=True)
    return Capabilities(chat=bool({TEXT, AUDIO} & modalities), speech=speech, transcription=TRANSCRIPT in modalities)


def cannot_serve(topology: Any, endpoint: str) -> str:
    """Why this topology cannot serve ``endpoint`` (for a 404)."""
    why = {
        "/v1/audio/speech": (
            "its entry stage does not route straight to an audio terminal (text to speech without an LLM),"
            " nor is every terminal an audio one"
        ),
        "/v1/audio/transcriptions": "it has no terminal of modality 'transcript'",
        "/v1/audio/translations": "it has no terminal of modality 'transcript'",
        "/v1/realtime": "it has no text, audio or transcript terminal",
    }[endpoint]
    return f"topology {topology.name!r} does not serve {endpoint}: {why}"
