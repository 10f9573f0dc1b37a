"""``/v1/realtime``: the OpenAI Realtime protocol over a WebSocket or WebRTC.

``events`` (the protocol's typed events), ``vad`` (Silero server VAD and turn detection),
``smart_turn`` (semantic end of turn), ``echo_guard``, ``formats`` (G.711 at the edge),
``turns`` (the conversation a session keeps), ``responses`` (one pipeline request
streamed as response events), ``session`` (one session's state and its event handlers,
whatever carries it: a package of its parts), ``channel`` (what both transports share: the checks, the count,
parsing and errors, the bounded outbox), ``route`` (the WebSocket transport) and
``webrtc`` (``POST /v1/realtime/calls`` on aiortc, with ``answer_track``, the outbound
audio, and ``ice``, the addresses offered; ``calls`` stands in when aiortc is not installed).
"""
