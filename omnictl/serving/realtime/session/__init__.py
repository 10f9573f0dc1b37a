"""One realtime session: its settings, input audio buffer, turn detection, conversation,
and the handler of each client event.

Handlers run one at a time, in the order the events arrived; what takes long (a
transcription, a response) runs in a task, so the session keeps listening, which is
what lets speech interrupt an answer (barge-in). Each handler either does what its
event asks or raises :class:`~omnictl.serving.realtime.events.EventError`, which the
route answers with an ``error`` event; the session goes on either way.

A session is a ``realtime`` one (a conversation answered by the pipeline) or a
``transcription`` one (``?intent=transcription`` or ``session.type: "transcription"``):
its committed turns are only transcribed, each one told as
``conversation.item.input_audio_transcription.delta`` / ``.completed``; no responses.

The session is made of parts, each a module of this package that reads on its own:
:mod:`.settings` (the settings and their checks), :mod:`.configure` (``session.update``),
:mod:`.input_audio` (appends, the microphone, turn detection, the echo hold, commits),
:mod:`.items` (items the client creates, truncates, deletes, retrieves),
:mod:`.transcription` (the user's turns transcribed), :mod:`.live` (transcribed while
spoken, with a live transcriber), :mod:`.preempt` (the answer started when speech pauses,
sent once the turn is confirmed) and :mod:`.lifecycle` (responses started, cancelled,
cleared); :mod:`.core` holds the state they share.
"""

from __future__ import annotations

import asyncio
import contextlib

from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.responses import AudioOut
from omnictl.serving.realtime.session.configure import Configure
from omnictl.serving.realtime.session.core import AudioRate, SessionCore
from omnictl.serving.realtime.session.input_audio import MIN_COMMIT_MS, PREFIX_MS, InputAudio
from omnictl.serving.realtime.session.items import Items
from omnictl.serving.realtime.session.lifecycle import Lifecycle
from omnictl.serving.realtime.session.live import LiveTranscription
from omnictl.serving.realtime.session.preempt import Preemption
from omnictl.serving.realtime.session.settings import DEFAULT_VOICE, SESSION_TYPES, TRANSPORTS, Settings
from omnictl.serving.realtime.session.transcription import Transcription

__all__ = [
    "DEFAULT_VOICE",
    "MIN_COMMIT_MS",
    "PREFIX_MS",
    "SESSION_TYPES",
    "TRANSPORTS",
    "AudioOut",
    "AudioRate",
    "RealtimeSession",
    "SessionCore",
    "Settings",
]


class RealtimeSession(Configure, InputAudio, Items, LiveTranscription, Preemption, Transcription, Lifecycle):
    """One session over any transport: each client event to the part that handles it."""

    async def handle(self, event: ev.ClientEvent) -> None:
        if not isinstance(event, (ev.InputAudioBufferAppend, ev.ConversationItemRetrieve)):
            # The client acts (commits, clears, creates, updates): an answer started at a pause
            # would answer a conversation that is no longer the one it heard.
            self._preempt_drop(f"the client sent {event.__struct_config__.tag}")
        handlers = {
            ev.SessionUpdate: self.session_update,
            ev.InputAudioBufferAppend: self.append,
            ev.InputAudioBufferCommit: self.commit,
            ev.InputAudioBufferClear: self.clear,
            ev.ConversationItemCreate: self.item_create,
            ev.ConversationItemTruncate: self.item_truncate,
            ev.ConversationItemDelete: self.item_delete,
            ev.ConversationItemRetrieve: self.item_retrieve,
            ev.ResponseCreate: self.response_create,
            ev.ResponseCancel: self.response_cancel,
            ev.OutputAudioBufferClear: self.output_audio_clear,
        }
        await handlers[type(event)](event)  # type: ignore[operator]  # the handler table maps each event type to the handler taking it

    async def close(self) -> None:
        """The socket closed: cancel the response, abort every pipeline request of this session."""
        self._preempt_drop("the session closed")
        if self._discarding:  # this drop's and any earlier one's not done yet (a clear, then the close at once)
            # before the tasks are cancelled: they abort the dropped answers' requests
            await asyncio.shield(asyncio.gather(*self._discarding))
        if self.response is not None:
            await self.response[0].cancel("client_cancelled")
        if self.audio_out is not None:
            self.audio_out.clear()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.response is not None:
            # Its task was cancelled before it ran a step, so none of its own cleanup ran: a
            # released preemptive answer's held request is still tracked (and may be submitting).
            await self.response[0].discard()
