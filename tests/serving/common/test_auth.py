from __future__ import annotations

from omnictl.serving.common.auth import authorized


def test_no_key_configured_lets_everyone_in() -> None:
    assert authorized({}, None)


def test_bearer_and_x_api_key() -> None:
    assert authorized({"authorization": "Bearer s3cret"}, "s3cret")
    assert authorized({"x-api-key": "s3cret"}, "s3cret")
    assert not authorized({"authorization": "Bearer wrong"}, "s3cret")
    assert not authorized({}, "s3cret")
    assert not authorized({"authorization": "Basic s3cret"}, "s3cret")
