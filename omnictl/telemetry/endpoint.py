"""Where traces go: ``--otlp-endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``, checked before start-up.

Like the standard variable, the value is the collector's base URL (``http://host:4318``),
and traces are posted to ``/v1/traces`` under it; a URL that already ends in ``/v1/traces``
is used as it is.
"""

from __future__ import annotations

import importlib.util
from typing import Mapping
from urllib.parse import urlsplit

import msgspec

from omnictl.exceptions import StartupError
from omnictl.profiling.sinks import SinkSpec

ENV_VAR = "OTEL_EXPORTER_OTLP_ENDPOINT"
# What the export imports (the `otel` extra), checked before anything starts.
_PACKAGES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
TRACES_PATH = "/v1/traces"


class OtlpTarget(msgspec.Struct, frozen=True):
    """What the profiling collector needs to export traces (it travels to its process as JSON):
    the traces URL, the served model, and each terminal's modality (so that no request
    carries anything for tracing but its caller's span)."""

    url: str
    model: str = ""
    modalities: dict[str, str] = {}  # terminal stage -> modality


def sink_spec(target: OtlpTarget) -> SinkSpec:
    """The profiling collector's sink that exports every finished request to ``target``."""
    return SinkSpec("omnictl.telemetry.export:otlp_sink", msgspec.to_builtins(target), logs=True)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for ``endpoint``; :class:`StartupError` when it is no http(s) URL."""
    try:
        parts = urlsplit(endpoint.strip())
        parts.port  # noqa: B018  (a port that is not a number raises ValueError here)
    except ValueError as exc:
        raise StartupError(
            f"the OTLP endpoint {endpoint!r} is not a URL: {exc}", hint="pass --otlp-endpoint http://HOST:4318"
        ) from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StartupError(
            f"the OTLP endpoint {endpoint!r} is not an http(s) URL with a host",
            hint="pass --otlp-endpoint http://HOST:4318: OTLP over HTTP; gRPC is not supported",
        )
    path = parts.path.rstrip("/")
    if not path.endswith(TRACES_PATH):
        path += TRACES_PATH
    return parts._replace(path=path).geturl()


def resolve_endpoint(flag: str | None, environ: Mapping[str, str]) -> str | None:
    """The traces URL from the flag, else from ``OTEL_EXPORTER_OTLP_ENDPOINT``; None: tracing off.

    An empty value means unset, as it does for the OpenTelemetry SDK.
    """
    value = flag if flag else environ.get(ENV_VAR, "")
    return traces_url(value) if value.strip() else None


def check_installed() -> None:
    """:class:`StartupError` naming the extra when the OpenTelemetry packages are missing
    (found without importing them)."""
    missing = [name for name in _PACKAGES if _find(name) is None]
    if missing:
        raise StartupError(
            f"exporting traces needs {', '.join(missing)}, which is not installed", hint="pip install 'omnictl[otel]'"
        )


def _find(module: str) -> object | None:
    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent package is missing
        return None
