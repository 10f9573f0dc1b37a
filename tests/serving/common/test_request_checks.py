"""The checks a request meets before any route: Host and Origin (the guard), the JSON body
(surrogates, 64-bit integers, nesting), the bounded echo of client data, and the errors'
envelope. In the test process, each test milliseconds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omnictl.exceptions import InvalidRequest, PayloadTooLarge
from omnictl.serving.app import create_app
from omnictl.serving.common.echo import ECHO_CHARS, RepeatLimiter, clip, clip_repr
from omnictl.serving.common.errors import field_error, invalid_response
from omnictl.serving.common.guard import RequestGuard, _split_host
from omnictl.serving.common.jsonbody import MAX_DEPTH, check_json, decode_json
from omnictl.serving.state import ServingState

# --- Host and Origin --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "split"),
    [
        ("LocalHost:8000", ("localhost", "8000")),
        ("example.com", ("example.com", "")),
        ("[::1]:9000", ("::1", "9000")),
        ("[::1]", ("::1", "")),
        ("::1", ("::1", "")),  # a bare IPv6 literal: its colons are not a port
        (" 10.0.0.1:80 ", ("10.0.0.1", "80")),
    ],
)
def test_split_host(header: str, split: tuple[str, str]) -> None:
    assert _split_host(header) == split


def test_the_hosts_a_loopback_server_answers_to() -> None:
    guard = RequestGuard()
    for header in ("127.0.0.1:8000", "localhost", "LOCALHOST:1", "[::1]:8000", "10.1.2.3"):
        assert guard.host_allowed(header), header
    for header in ("", ":8000", "attacker.example", "localhost.attacker.example:8000"):
        assert not guard.host_allowed(header), header
    assert RequestGuard(allowed_hosts=frozenset({"*"})).host_allowed("anything.example")


def test_for_bind_adds_the_name_a_server_is_bound_to_and_the_allowed_lists() -> None:
    named = RequestGuard.for_bind("Box.Lan", 8000, allowed_hosts=(" API.example ", " "), allowed_origins=("https://App.example/", ""))
    assert named.allowed_hosts == frozenset({"box.lan", "api.example"})
    assert named.allowed_origins == frozenset({"https://app.example"})
    # only a trailing slash is cut from an origin: its last letter stays, whatever its case
    assert RequestGuard.for_bind("::1", 1, allowed_origins=("http://LAN.BOX",)).allowed_origins == {"http://lan.box"}
    assert named.host_allowed("box.lan:8000") and named.host_allowed("API.example")
    assert RequestGuard.for_bind("0.0.0.0", 8000).allowed_hosts == frozenset()
    assert RequestGuard.for_bind("[::]", 8000).allowed_hosts == frozenset()
    assert RequestGuard.for_bind("localhost", 8000).allowed_hosts == frozenset()
    # a host:port entry allows only that port
    guard = RequestGuard(allowed_hosts=frozenset({"api.example:443"}))
    assert guard.host_allowed("api.example:443") and not guard.host_allowed("api.example:80")


def test_an_origin_is_allowed_when_it_is_the_server_itself_or_listed() -> None:
    guard = RequestGuard(allowed_origins=frozenset({"https://app.example"}))
    assert guard.origin_allowed("http://localhost:8000", "localhost:8000")
    assert guard.origin_allowed("http://LOCALHOST:8000/", "localhost:8000")
    assert guard.origin_allowed("https://app.example/", "localhost:8000")
    assert not guard.origin_allowed("http://localhost:9000", "localhost:8000")  # another port: another origin
    assert not guard.origin_allowed("http://evil.example", "localhost:8000")
    assert not guard.origin_allowed("null", "localhost:8000")
    assert not guard.origin_allowed("file://localhost:8000", "localhost:8000")
    assert not guard.origin_allowed("http://", "")
    assert guard.origin_allowed("http://[::1]:8000", "[::1]:8000")
    assert guard.origin_allowed("https://localhost:8443", "localhost:8443")
    assert guard.origin_allowed("http://[::1]", "::1")  # the same host, bracketed or not
    assert RequestGuard(allowed_origins=frozenset({"http://box"})).origin_allowed("http://BOX", "localhost")
    assert RequestGuard(allowed_origins=frozenset({"*"})).origin_allowed("null", "localhost")


def guarded_client(base_url: str = "http://localhost", **guard: Any) -> TestClient:
    app = create_app(ServingState(model_name="m"), RequestGuard(**guard) if guard else None)
    return TestClient(app, base_url=base_url)


def test_a_foreign_host_is_421_and_a_foreign_origin_403_before_any_route() -> None:
    client = guarded_client("http://attacker.example")
    response = client.get("/health")
    assert response.status_code == 421
    error = response.json()["error"]
    assert error["code"] == "misdirected_request" and error["param"] == "Host"
    assert "'attacker.example'" in error["message"] and "--allowed-hosts" in error["message"]

    local = guarded_client()
    assert local.get("/health").status_code == 503  # starting: the guard let it through
    refused = local.get("/health", headers={"Origin": "http://evil.example"})
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["code"] == "forbidden_origin" and error["param"] == "Origin"
    assert "'http://evil.example'" in error["message"] and "--allowed-origins" in error["message"]
    assert local.get("/health", headers={"Origin": "http://localhost"}).status_code == 503


def test_a_long_host_is_clipped_in_the_message() -> None:
    client = guarded_client()
    response = client.get("/health", headers={"Host": "h" * 500 + ".example"})
    assert response.status_code == 421 and "more characters" in response.json()["error"]["message"]
    assert len(response.json()["error"]["message"]) < 300


def test_a_websocket_from_a_foreign_origin_is_closed_in_its_handshake() -> None:
    client = guarded_client()
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect("ws://localhost/v1/realtime", headers={"Origin": "http://evil.example"}):
            pass
    assert refused.value.code == 1008 and "evil.example" in refused.value.reason
    assert len(refused.value.reason) <= 120


# --- the JSON body ----------------------------------------------------------------------


def refused(raw: bytes) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        decode_json(raw)
    return caught.value


def test_a_body_that_is_not_json_is_refused_naming_the_body() -> None:
    for raw in (b"{", b"\xff\xfe", b""):
        error = refused(raw)
        assert error.field == "body" and str(error).startswith("body is not valid JSON")


def test_integers_must_fit_in_64_bits() -> None:
    assert decode_json(json.dumps({"n": 2**63 - 1, "m": -(2**63)}).encode()) == {"n": 2**63 - 1, "m": -(2**63)}
    for value in (2**63, -(2**63) - 1):
        error = refused(json.dumps({"a": {"n": value}}).encode())
        assert error.field == "a.n" and "'a.n' is out of range" in str(error)
    top = refused(str(2**64).encode())
    assert top.field == "body"
    assert decode_json(b"[true, null, 1.5e300]") == [True, None, 1.5e300]


def test_lone_surrogates_are_refused_where_they_are() -> None:
    error = refused(b'{"messages": [{"content": "ok \\ud800"}]}')
    assert error.field == "messages[0].content" and "lone surrogate ('\\ud800')" in str(error)
    key = refused(b'{"a": {"\\udc00": 1}}')
    assert key.field == "a.'\\udc00'"
    top_key = refused(b'{"\\udc00": 1}')
    assert top_key.field == "'\\udc00'"
    assert refused(b'"\\ud800"').field == "body"
    assert decode_json('{"é": "ünïcode ✓"}'.encode()) == {"é": "ünïcode ✓"}  # valid non-ASCII passes


def test_nesting_is_bounded() -> None:
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    decode_json(at_limit.encode())
    deeper = refused(("[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2)).encode())
    assert f"nested more than {MAX_DEPTH} levels" in str(deeper) and deeper.field.startswith("[0]")
    recursion = refused(("[" * 100_000 + "]" * 100_000).encode())  # json.loads itself gives up
    assert recursion.field == "body" and f"more than {MAX_DEPTH} levels" in str(recursion)
    with pytest.raises(InvalidRequest) as keyed:
        check_json({"a": [[[[1]]]]}, depth=MAX_DEPTH - 2)
    assert keyed.value.field == "a[0][0]"


# --- echoed client data and the error envelope ------------------------------------------


def test_clip_bounds_echoed_text_and_escapes_surrogates() -> None:
    assert clip("short") == "short"
    assert clip("x" * ECHO_CHARS) == "x" * ECHO_CHARS
    assert clip("x" * (ECHO_CHARS + 5)) == "x" * ECHO_CHARS + "... (5 more characters)"
    assert clip("abcdef", 3) == "abc... (3 more characters)"
    assert clip("a\ud800b") == "a\\ud800b"
    assert clip_repr("y" * 1000) == "'" + "y" * ECHO_CHARS + f"'... ({1000 - ECHO_CHARS} more characters)"
    assert clip_repr(12) == "12"
    assert clip_repr("y" * 1000, 10) == "'yyyyyyyyyy'... (990... (17 more characters)"  # bounded twice over
    assert clip_repr("q" * 10, 10) == "'qqqqqqqqq... (2 more characters)"  # at the limit: its repr, clipped
    assert clip_repr(list(range(100)), 10) == "[0, 1, 2, ... (380 more characters)"  # any value's repr
    assert clip_repr("q" * 10, 12) == "'qqqqqqqqqq'"  # a string at the limit: its repr whole


def test_a_repeated_error_is_let_through_once_per_interval_with_the_count_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    import omnictl.serving.common.echo as echo

    now = [100.0]
    monkeypatch.setattr(echo.time, "monotonic", lambda: now[0])
    limiter = RepeatLimiter(interval_s=10.0, max_keys=2)
    assert limiter.allow("a") == (True, 0)
    assert limiter.allow("a") == (False, 0)
    assert limiter.allow("a") == (False, 0)
    now[0] = 109.9
    assert limiter.allow("a") == (False, 0)
    now[0] = 110.0
    assert limiter.allow("a") == (True, 3)  # three left out since it was last let through
    assert limiter.allow("b") == (True, 0)
    assert limiter.allow("c") == (True, 0)  # over max_keys: the oldest ("a") is forgotten
    assert limiter.allow("a") == (True, 0)
    assert limiter.allow("c") == (False, 0)


def test_a_key_let_through_again_is_the_newest_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    import omnictl.serving.common.echo as echo

    now = [0.0]
    monkeypatch.setattr(echo.time, "monotonic", lambda: now[0])
    limiter = RepeatLimiter(interval_s=10.0, max_keys=2)
    limiter.allow("a")
    limiter.allow("b")
    now[0] = 20.0
    assert limiter.allow("a") == (True, 0)  # let through again: now the newest
    limiter.allow("c")  # one key too many: the oldest, "b", is forgotten
    assert limiter.allow("a") == (False, 0) and limiter.allow("b") == (True, 0)


def test_invalid_responses_are_400_or_413_naming_the_field() -> None:
    bad = invalid_response(field_error("messages", "must be a list"))
    assert bad.status_code == 400
    body = json.loads(bytes(bad.body))
    assert body["error"] == {"message": "'messages' must be a list", "type": "invalid_request_error",
                             "code": "invalid_request", "param": "messages"}
    large = invalid_response(PayloadTooLarge("too big", field="body"))
    assert large.status_code == 413
    assert json.loads(bytes(large.body))["error"]["code"] == "payload_too_large"


# --- what a topology serves, and the key --------------------------------------------------


def topology(entry_route: bool, terminals: dict[str, str], via: str | None = None) -> Any:
    """An entry stage ``a`` leading to each terminal (through ``via`` when given)."""
    from omnictl.topology.validation import loads

    lines = ["name: shaped", "stages:", "  - name: a", "    factory: nowhere.f"]
    if entry_route:
        lines.append("    route_fn: nowhere.route")
    lines.append(f"    next: [{via or ', '.join(terminals)}]")
    if via:
        lines += [f"  - name: {via}", "    factory: nowhere.f", f"    next: [{', '.join(terminals)}]"]
    for name, modality in terminals.items():
        lines += [f"  - name: {name}", "    factory: nowhere.f", "    terminal: true", f"    modality: {modality}"]
    return loads("\n".join(lines) + "\n")


def test_capabilities_follow_the_topologys_shape() -> None:
    from omnictl.serving.common.capabilities import cannot_serve, capabilities

    every = capabilities(topology(True, {"t": "text", "s": "audio", "h": "transcript"}))
    assert (every.chat, every.speech, every.transcription, every.realtime) == (True, True, True, True)
    assert every.endpoints() == ["/v1/chat/completions", "/v1/realtime", "/v1/audio/speech",
                                 "/v1/audio/transcriptions", "/v1/audio/translations"]
    fan_out = capabilities(topology(False, {"t": "text", "s": "audio"}))  # no route_fn: it does not choose
    assert (fan_out.chat, fan_out.speech, fan_out.transcription) == (True, False, False)
    # audio only after another stage, and a text answer beside it: the entry does not take text to speak
    indirect = capabilities(topology(True, {"s": "audio", "t": "text"}, via="llm"))
    assert (indirect.chat, indirect.speech) == (True, False)
    audio_only = capabilities(topology(True, {"s": "audio"}))
    assert audio_only.endpoints() == ["/v1/chat/completions", "/v1/realtime", "/v1/audio/speech"]
    hearing = capabilities(topology(False, {"h": "transcript"}))  # transcription sessions, no conversation
    assert (hearing.chat, hearing.realtime, hearing.conversation, hearing.transcription) == (False, True, False, True)
    assert hearing.endpoints() == ["/v1/realtime", "/v1/audio/transcriptions", "/v1/audio/translations"]
    shaped = topology(False, {"h": "transcript"})
    assert cannot_serve(shaped, "/v1/realtime") == (
        "topology 'shaped' does not serve /v1/realtime: it has no text, audio or transcript terminal")
    for endpoint in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        assert cannot_serve(shaped, endpoint).endswith(f"serve {endpoint}: it has no terminal of modality 'transcript'")


def test_the_key_is_read_from_a_bearer_header_or_x_api_key() -> None:
    from omnictl.serving.common.auth import authorized

    assert authorized({"authorization": "bearer  k1 "}, "k1")  # the scheme's case and spaces do not matter
    assert authorized({"authorization": "Basic xyz", "x-api-key": "k1"}, "k1")  # not a bearer: x-api-key counts
    assert not authorized({"authorization": "Bearer k1", "x-api-key": "k2"}, "k2")  # a bearer wins
    assert not authorized({"authorization": "Bearer"}, "k1") and not authorized({"x-api-key": ""}, "k1")
    assert authorized({"authorization": "anything"}, None)
