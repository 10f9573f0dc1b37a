"""Standard ``logging`` for omnictl: one configuration, the request id on request records.

:func:`configure` installs one handler on the ``omnictl`` logger, text or JSON lines.
:func:`request_scope` sets the current request id in a context variable for the code it
wraps (an asyncio task inherits it), and every record logged meanwhile carries it as
``request_id`` (``-`` outside a request), so an operator can find one request in a day
of logs: ``grep chatcmpl-...`` in text, ``select(.request_id == ...)`` in JSON.

Stage processes log the same way (:func:`configure_stage_process`, at their start, with the
server's level and format from :func:`settings`): every record is tagged with the OS
process it came from (``tts#1`` for a replica, else the topology process's name), goes to
the inherited stderr (the server's output) and to ``<run dir>/logs/<process>.log``; the
server's own records go to ``<run dir>/logs/server.log`` (:func:`attach_file`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import logging.handlers
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Iterator, Literal

LogFormat = Literal["text", "json"]
FORMATS = ("text", "json")
LOGS_DIR = "logs"  # under the run directory
SERVER_LOG = "server"
_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("omnictl_request_id", default="-")
_TEXT = "%(asctime)s %(levelname)s %(name)s [%(process_name)s] request=%(request_id)s: %(message)s"
_HANDLER_NAME = "omnictl"
# A day of logs must not fill the disk: each file rotates at this size, keeping this many old ones.
_FILE_BYTES = 16 * 1024 * 1024
_FILE_BACKUPS = 3


@dataclass(frozen=True)
class LogSettings:
    """What a stage process is started with, so its records look like the server's."""

    level: str  # a logging level name: DEBUG, INFO, WARNING, ERROR
    format: LogFormat


_settings = LogSettings("WARNING", "text")  # Python's default (warnings and up) until configured
_configured = False


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


def settings() -> LogSettings:
    """The level and format :func:`configure` was last given (stage processes get the same)."""
    return _settings


def configured() -> bool:
    """Whether :func:`configure` was called (``omnictl serve`` does): until then omnictl's
    records reach stderr only through Python's last-resort handler, which a file handler on
    the ``omnictl`` logger would silence, so a run's ``server.log`` is written only after it."""
    return _configured


def log_file(run_dir: Path, process_name: str) -> Path:
    """Where ``process_name`` (``server``, or a stage process such as ``tts#1``) writes its log."""
    return run_dir / LOGS_DIR / f"{process_name}.log"


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
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "process": record.__dict__.get("process_name", "-"),
            "pid": record.process,
            "request_id": record.__dict__.get("request_id", "-"),
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def _handler(target: logging.Handler, fmt: LogFormat, process_name: str) -> logging.Handler:
    target.set_name(_HANDLER_NAME)
    target.addFilter(_Context(process_name))
    target.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    return target


def _check(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def configure(
    level: str | int = "INFO", fmt: LogFormat = "text", stream: IO[str] | None = None, process_name: str = "server"
) -> logging.Handler:
    """Send the ``omnictl`` loggers' records at ``level`` and above to ``stream`` (stderr)."""
    global _settings, _configured
    _check(fmt)
    logger = logging.getLogger("omnictl")
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)
    handler = _handler(logging.StreamHandler(stream or sys.stderr), fmt, process_name)
    logger.addHandler(handler)
    logger.setLevel(level.upper() if isinstance(level, str) else level)
    logger.propagate = False
    _settings = LogSettings(logging.getLevelName(logger.level), fmt)
    _configured = True
    return handler


def attach_file(path: Path, process_name: str = SERVER_LOG) -> logging.Handler:
    """Also write the ``omnictl`` loggers' records to ``path`` (rotated), in the configured
    format; :func:`detach` it when the run ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=_FILE_BYTES, backupCount=_FILE_BACKUPS, encoding="utf-8"
    )
    _handler(handler, _settings.format, process_name)
    handler.set_name(f"{_HANDLER_NAME}:file")  # not replaced by configure()
    logging.getLogger("omnictl").addHandler(handler)
    return handler


def detach(handler: logging.Handler) -> None:
    logging.getLogger("omnictl").removeHandler(handler)
    handler.close()


def configure_stage_process(level: str, fmt: LogFormat, process_name: str, path: Path | None) -> None:
    """A stage process's logging, set up before anything else runs in it.

    Handlers go on the root logger, so records of the user's stage code and of the
    libraries it calls are tagged and gathered too: omnictl's at ``level``, everyone
    else's at ``level`` or WARNING, whichever is higher (model libraries are chatty at
    INFO). To stderr, which is the server's, and to ``path`` when the run has a directory.
    """
    global _settings
    _check(fmt)
    _settings = LogSettings(level, fmt)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(_handler(logging.StreamHandler(sys.stderr), fmt, process_name))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        root.addHandler(
            _handler(
                logging.handlers.RotatingFileHandler(
                    path, maxBytes=_FILE_BYTES, backupCount=_FILE_BACKUPS, encoding="utf-8"
                ),
                fmt,
                process_name,
            )
        )
    root.setLevel(max(logging.getLevelName(level), logging.WARNING))
    omnictl = logging.getLogger("omnictl")
    omnictl.setLevel(level)
    omnictl.propagate = True
    logging.captureWarnings(True)  # Python warnings of the stage's code, tagged like the rest
    sys.excepthook = _log_uncaught  # a crash's traceback too, in this process's log


def _log_uncaught(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
    logging.getLogger("omnictl.stage.worker").critical("the stage process crashed", exc_info=(kind, error, traceback))
