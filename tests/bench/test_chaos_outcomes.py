"""The chaos soak's accounting: a request the server ended at its deadline counts apart."""

from __future__ import annotations

from benchmarks.chaos_load import Outcomes, _why


def test_the_servers_deadline_is_told_apart_from_other_failures() -> None:
    outcomes = Outcomes()
    deadline = {"error": {"message": "request r1 missed its deadline of 20s; terminals still expected: ['x']",
                          "code": "stage_failed"}}
    died = {"error": {"message": "stage 'front' failed: replica 'front#0' died", "code": "stage_failed"}}
    for status, body in [(500, deadline), (500, died), (500, died), (503, "not json")]:
        outcomes.failed[_why(status, body)] += 1
    assert dict(outcomes.failed) == {"500 deadline": 1, "500 stage_failed": 2, "503": 1}
    assert (outcomes.failed_total, outcomes.deadline_ended) == (4, 1)
