"""``/v1/audio/transcriptions`` and ``/v1/audio/translations``: the route and the uploaded file."""
