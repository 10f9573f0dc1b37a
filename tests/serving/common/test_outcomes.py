"""One map from a pipeline outcome to an HTTP status and error code (errors.OUTCOMES)."""

from __future__ import annotations

import pytest

from omnictl import exceptions
from omnictl.exceptions import ServerShutdown
from omnictl.serving.common.errors import OUTCOMES, ErrorCode, ended, error_code, outcome_response


def _tree(root: type[Exception]) -> set[type[Exception]]:
    found = {root}
    for sub in root.__subclasses__():
        found |= _tree(sub)
    return found


def test_the_map_is_total_over_the_outcome_tree() -> None:
    # every class of the tree has its own line: a new subclass must be placed on purpose
    tree = set().union(
        *(_tree(root) for root in (exceptions.RequestError, exceptions.InvalidRequest, exceptions.Overloaded))
    ) | {exceptions.PipelineDead}
    mapped = {cls for cls, _ in OUTCOMES}
    missing = sorted(cls.__qualname__ for cls in tree - mapped)
    assert missing == [], f"outcomes with no status and code in errors.OUTCOMES: {missing}"


def test_a_subclass_comes_before_its_base() -> None:
    # isinstance answers with the first line: a base before its subclass would shadow it
    for i, (cls, _) in enumerate(OUTCOMES):
        for later, _ in OUTCOMES[i + 1 :]:
            assert not issubclass(later, cls), f"{later.__name__} comes after its base {cls.__name__}"


@pytest.mark.parametrize(
    "outcome, expected",
    [
        (exceptions.InvalidRequest("bad", field="x"), ErrorCode(400, "invalid_request_error", "invalid_request")),
        (exceptions.PayloadTooLarge("big", field="body"), ErrorCode(413, "invalid_request_error", "payload_too_large")),
        (exceptions.Overloaded("busy", retry_after=1), ErrorCode(429, "rate_limit_error", "overloaded")),
        (exceptions.InputStalled("behind", retry_after=1), ErrorCode(429, "rate_limit_error", "input_stalled")),
        (exceptions.AdmissionTimeout("waited", retry_after=1), ErrorCode(503, "server_error", "queue_timeout")),
        (exceptions.PipelineDead("down"), ErrorCode(503, "server_error", "pipeline_dead")),
        (exceptions.RequestFailed("r", "boom"), ErrorCode(500, "server_error", "stage_failed")),
        (exceptions.RequestAborted("r", "gone"), ErrorCode(409, "server_error", "aborted")),
        (ServerShutdown("r", "stopping"), ErrorCode(503, "server_error", "server_shutdown")),
    ],
)
def test_each_outcome_has_its_status_and_code(outcome: Exception, expected: ErrorCode) -> None:
    assert error_code(outcome) == expected
    response = outcome_response(outcome)
    assert response.status_code == expected.status


def test_an_exception_that_is_no_outcome_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="ValueError is not a pipeline outcome"):
        error_code(ValueError("x"))


def test_a_requests_last_event_is_its_outcome() -> None:
    assert error_code(ended("r", error="bad", field="top_k", ended_by_server=None)).status == 400
    assert error_code(ended("r", error="boom", field=None, ended_by_server=None)).status == 500
    assert error_code(ended("r", error=None, field=None, ended_by_server="the server is stopping")).status == 503
    assert error_code(ended("r", error=None, field=None, ended_by_server=None)).status == 409
