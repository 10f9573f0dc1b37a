"""--otlp-endpoint / OTEL_EXPORTER_OTLP_ENDPOINT: the traces URL, the flag winning, bad values named."""

from __future__ import annotations

import pytest

from omnictl.exceptions import StartupError
from omnictl.telemetry import endpoint
from omnictl.telemetry.endpoint import check_installed, resolve_endpoint, traces_url


@pytest.mark.parametrize("endpoint, url", [
    ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
    ("http://collector:4318/", "http://collector:4318/v1/traces"),
    ("https://otel.example.com/otlp", "https://otel.example.com/otlp/v1/traces"),
    ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
])
def test_the_base_url_gets_the_traces_path(endpoint: str, url: str) -> None:
    assert traces_url(endpoint) == url


@pytest.mark.parametrize("endpoint", ["collector:4318", "grpc://collector:4317", "http://", "http://host:port", "/v1/traces"])
def test_an_endpoint_that_is_no_http_url_is_refused_by_name(endpoint: str) -> None:
    with pytest.raises(StartupError, match="OTLP endpoint") as raised:
        traces_url(endpoint)
    assert repr(endpoint) in str(raised.value)


def test_the_flag_wins_over_the_variable_and_empty_means_off() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://from-env:4318"}
    assert resolve_endpoint("http://from-flag:4318", env) == "http://from-flag:4318/v1/traces"
    assert resolve_endpoint(None, env) == "http://from-env:4318/v1/traces"
    assert resolve_endpoint(None, {}) is None
    assert resolve_endpoint(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": " "}) is None


def test_missing_packages_are_named_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    check_installed()  # installed here (the otel extra)
    monkeypatch.setattr(endpoint, "_PACKAGES", ("opentelemetry.sdk", "opentelemetry_not_there.exporter"))
    with pytest.raises(StartupError, match=r"opentelemetry_not_there.exporter, which is not installed.*omnictl\[otel\]"):
        check_installed()
