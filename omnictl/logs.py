"""Standard ``logging`` for omnictl: one configuration, the request id on request records.

:func:`configure` installs one handler on the ``omnictl`` logger, text or JSON lines.
:func:`request_scope` sets the current request id in a context variable for the code it
wraps (an asyncio task inherits it), and every record logged meanwhile carries it as
``request_id`` (``-`` outside a request), so an operator can find one request in a day
of logs: ``grep chatcmpl-...`` in text, ``select(.request_id == ...)`` in JSON.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from typing import IO, Iterator, Literal

LogFormat = Literal["text", "json"]
FORMATS = ("text", "json")
_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("omnictl_request_id", default="-")
_TEXT = "%(asctime)s %(levelname)s %(name)s [%(process_name)s] request=%(request_id)s: %(message)s"
_HANDLER_NAME = "omnictl"


@contextlib.contextmanager
def request_scope(request_id: str) -> Iterator[None]:
    """Records logged inside carry ``request_id``."""
    token = _request_id.set(request_id)
    try:
        yield
    finally:
        _request_id.reset(token)


def current_request_id() -> str:
    return _request_id.get()


class _Context(logging.Filter):
    """Adds ``request_id`` and ``process_name`` (the stage process, or ``server``) to a record."""

    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get()
        record.process_name = self.process_name
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, process, request_id, message (and traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record), "level": record.levelname, "logger": record.name,
            "process": record.__dict__.get("process_name", "-"), "pid": record.process,
            "request_id": record.__dict__.get("request_id", "-"), "message": record.getMessage(),
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str | int = "INFO", fmt: LogFormat = "text", stream: IO[str] | None = None,
              process_name: str = "server") -> logging.Handler:
    """Send the ``omnictl`` loggers' records at ``level`` and above to ``stream`` (stderr)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    logger = logging.getLogger("omnictl")
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.addFilter(_Context(process_name))
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    logger.addHandler(handler)
    logger.setLevel(level.upper() if isinstance(level, str) else level)
    logger.propagate = False
    os.environ["OMNICTL_LOG_LEVEL"] = logging.getLevelName(logger.level)  # stage processes inherit both
    os.environ["OMNICTL_LOG_FORMAT"] = fmt
    return handler
