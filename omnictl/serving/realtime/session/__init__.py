"""One realtime session: its settings, input audio buffer, turn detection, conversation,
and the handler of each client event.

A session is a ``realtime`` one (a conversation answered by the pipeline) or a
``transcription`` one (``?intent=transcription`` or ``session.type: "transcription"``):
its committed turns are only transcribed, each one told as
``conversation.item.input_audio_transcription.delta`` / ``.completed``; no responses.

:mod:`.shell` is the session: one inbox feeding the turn-taking core
(:mod:`omnictl.serving.realtime.turn_taking`, which decides) and doing what it returns with
the session's parts, each a module that reads on its own and is handed only what it calls:
:mod:`.context` (what every part shares), :mod:`.settings` (the settings and their checks),
:mod:`.listening` (appends, the buffer, turn detection, the echo hold), :mod:`.transcripts`
(the user's turns transcribed, whole or while spoken), :mod:`.replies` (responses, and the
early answer held from a pause), :mod:`.items` (items the client handles by id),
:mod:`.configure` (``session.update``), :mod:`.milestones` (a turn's latency milestones).
"""

from __future__ import annotations

from omnictl.serving.realtime.responses import AudioOut
from omnictl.serving.realtime.session.listening import MIN_COMMIT_MS, PREFIX_MS
from omnictl.serving.realtime.session.settings import DEFAULT_VOICE, SESSION_TYPES, TRANSPORTS, Settings
from omnictl.serving.realtime.session.shell import RealtimeSession

__all__ = [
    "DEFAULT_VOICE",
    "MIN_COMMIT_MS",
    "PREFIX_MS",
    "SESSION_TYPES",
    "TRANSPORTS",
    "AudioOut",
    "RealtimeSession",
    "Settings",
]
