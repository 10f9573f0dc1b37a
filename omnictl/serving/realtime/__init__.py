"""``/v1/realtime``: the OpenAI Realtime protocol over a WebSocket.

``events`` (the protocol's typed events), ``vad`` (Silero server VAD and turn detection),
``turns`` (the conversation a session keeps), ``responses`` (one pipeline request
streamed as response events), ``session`` (one socket's state and its event handlers)
and ``route`` (the WebSocket endpoint: auth, limits, the receive loop).
"""
