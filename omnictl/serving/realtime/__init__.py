"""``/v1/realtime``: the OpenAI Realtime protocol over a WebSocket or WebRTC.

``events`` (the protocol's typed events), ``vad`` (Silero server VAD and turn detection),
``smart_turn`` (semantic end of turn), ``echo_guard``, ``formats`` (G.711 at the edge),
``turns`` (the conversation a session keeps), ``responses`` (one pipeline request
streamed as response events), ``turn_taking`` (the pure state machine that decides every
turn), ``session`` (one session, whatever carries it: the shell that feeds that core and does
what it says, and its parts), ``rate`` (the token bucket), ``frontend`` (the session's audio
front end), ``channel`` (what both transports share: the checks, the count, parsing and
errors, the bounded outbox), ``route`` (the WebSocket transport) and
``webrtc`` (``POST /v1/realtime/calls`` on aiortc, with ``answer_track``, the outbound
audio, and ``ice``, the addresses offered; ``calls`` stands in when aiortc is not installed).
"""
