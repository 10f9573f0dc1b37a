"""``/v1/audio/speech`` and ``/v1/audio/voices``: the route, the encoders, the installed voices."""
