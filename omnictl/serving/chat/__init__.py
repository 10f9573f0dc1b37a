"""``POST /v1/chat/completions``: the route, its request envelope, its responses and their SSE framing."""
