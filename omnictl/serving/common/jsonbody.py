"""Decode a request body as JSON and refuse what would break later, naming the field.

``json.loads`` accepts things that fail far from the parser, as plain-text 500s: lone
surrogates (``"\\ud800"``) that no UTF-8 encoder can write back (the first SSE chunk
echoing ``model`` raised outside the error handling and leaked the request), integers
beyond the wire encoding's 64 bits (``max_tokens`` 10**30), and nesting deep enough to
exhaust the recursion limit. Each is a 400 here, naming where it is.
"""

from __future__ import annotations

import json
from typing import Any

from omnictl.exceptions import InvalidRequest

MAX_DEPTH = 32  # an OpenAI chat body is at most ~6 levels deep
_INT_LOW, _INT_HIGH = -(2**63), 2**63 - 1  # what msgpack (the wire encoding) carries as a signed int


def decode_json(raw: bytes) -> Any:
    """The body as JSON, checked by :func:`check_json`; :class:`InvalidRequest` otherwise."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}", field="body") from exc
    except RecursionError as exc:
        raise InvalidRequest(f"body is nested more than {MAX_DEPTH} levels deep", field="body") from exc
    check_json(body)
    return body


def check_json(value: Any, path: str = "", depth: int = 0) -> None:
    """Refuse lone surrogates, out-of-range integers and deep nesting anywhere in ``value``."""
    if depth > MAX_DEPTH:
        raise InvalidRequest(f"'{path or 'body'}' is nested more than {MAX_DEPTH} levels deep", field=path or "body")
    if isinstance(value, str):
        _check_text(value, path or "body")
    elif isinstance(value, bool) or value is None or isinstance(value, float):
        return
    elif isinstance(value, int):
        if not _INT_LOW <= value <= _INT_HIGH:
            raise InvalidRequest(f"'{path}' is out of range: integers must fit in 64 bits", field=path or "body")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"{path}.{key!r}" if path else repr(key))
            check_json(item, f"{path}.{key}" if path else key, depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_json(item, f"{path}[{i}]", depth + 1)


def _check_text(text: str, path: str) -> None:
    if text.isascii():  # the common case, and every base64 payload: no encoding needed
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"'{path}' holds a lone surrogate ({text[exc.start]!a}); send valid Unicode", field=path
        ) from exc
