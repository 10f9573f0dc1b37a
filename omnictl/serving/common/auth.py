"""Optional API-key check: ``Authorization: Bearer KEY`` (what the openai client sends)."""

from __future__ import annotations

import hmac
from typing import Mapping


def authorized(headers: Mapping[str, str], api_key: str | None) -> bool:
    """True when no key is configured, or the request presents exactly that key."""
    if api_key is None:
        return True
    header = headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":
        presented = headers.get("x-api-key", "")
    # constant-time comparison: the key must not leak through response timing
    return hmac.compare_digest(presented.strip().encode(), api_key.encode())
