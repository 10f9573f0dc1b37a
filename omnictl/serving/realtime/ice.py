"""Which local addresses ICE offers for a WebRTC call (see :mod:`omnictl.serving.realtime.webrtc`).

aioice gathers host candidates on every interface but loopback, with no setting for it; its
address lookup is replaced once per process by one that honours :func:`candidate_hosts`,
set per offer in a context variable.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import os

HOSTS_ENV = "OMNICTL_WEBRTC_HOSTS"

# Per offer (a context variable: aioice gathers in tasks of the request that answers it); None:
# every interface's (aioice's own choice).
_hosts: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("omnictl_webrtc_hosts", default=None)


def candidate_hosts(local: str | None) -> list[str] | None:
    """The addresses to gather host candidates on: ``OMNICTL_WEBRTC_HOSTS``, else ``local``, the
    address the offer came in on (the client reached it), else None (every interface: aioice's choice)."""
    configured = os.environ.get(HOSTS_ENV, "").strip()
    if configured:
        return [h.strip() for h in configured.split(",") if h.strip()]
    if local is not None:
        with contextlib.suppress(ValueError):  # not an address: every interface
            if not ipaddress.ip_address(local).is_unspecified:
                return [local]
    return None


def install_host_filter() -> None:
    """Replace aioice's address lookup (once per process) by one that honours :func:`candidate_hosts`."""
    import aioice.ice

    original = aioice.ice.get_host_addresses
    if getattr(original, "omnictl", False):
        return

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        hosts = _hosts.get()
        if hosts is None:
            return original(use_ipv4, use_ipv6)
        return [h for h in hosts if (":" in h and use_ipv6) or (":" not in h and use_ipv4)]

    host_addresses.omnictl = True  # type: ignore[attr-defined]  # marks the replacement as installed
    aioice.ice.get_host_addresses = host_addresses


def restrict_to(local: str | None) -> None:
    """The offer being answered came in on ``local``: gather on :func:`candidate_hosts` of it."""
    _hosts.set(candidate_hosts(local))
