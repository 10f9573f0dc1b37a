"""What of a client's own data goes back out, in error messages and in the log: bounded.

A bad event may carry a megabyte string (an event ``type``, an ``event_id``); echoing it
whole into the ``error`` event or an INFO log line once turned 105 KB on the wire into
105 MB of log. :func:`clip` bounds any echoed value; :class:`RepeatLimiter` logs an
error that repeats (the same code from the same session) once per interval, with how
many were left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

ECHO_CHARS = 200  # of any client-supplied value quoted back


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out; lone surrogates escaped
    (they could not be written back as UTF-8)."""
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clip_repr(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` bounded (the repr of a huge value is never built whole for strings)."""
    if isinstance(value, str) and len(value) > limit:
        return clip(repr(value[:limit]) + f"... ({len(value) - limit} more characters)", limit * 2)
    return clip(repr(value), limit)


@dataclass
class RepeatLimiter:
    """Say yes to the first occurrence of a key, then at most once per ``interval_s``."""

    interval_s: float = 10.0
    max_keys: int = 256  # distinct keys remembered (oldest forgotten first)
    _last: dict[str, tuple[float, int]] = field(default_factory=dict)

    def allow(self, key: str) -> tuple[bool, int]:
        """(log it now?, how many of ``key`` were suppressed since it was last logged)."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval_s:
            self._last[key] = (last[0], last[1] + 1)
            return False, 0
        suppressed = last[1] if last is not None else 0
        self._last.pop(key, None)
        self._last[key] = (now, 0)
        while len(self._last) > self.max_keys:
            self._last.pop(next(iter(self._last)))
        return True, suppressed
