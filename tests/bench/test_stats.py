from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from omnictl.bench.stats import RequestRecord, latency_summaries, summarize, throughput


def test_summary_of_known_values() -> None:
    s = summarize([0.1 * i for i in range(1, 101)] + [None])
    assert s.count == 100
    assert s.mean == pytest.approx(5.05)
    assert s.p50 == pytest.approx(5.05)
    assert s.p90 == pytest.approx(float(np.percentile(np.arange(1, 101) * 0.1, 90)))


def test_empty_summary_is_all_none() -> None:
    s = summarize([None, None])
    assert (s.count, s.mean, s.p50, s.p99) == (0, None, None, None)


@given(st.lists(st.floats(min_value=0, max_value=1e4), min_size=1, max_size=200))
def test_percentiles_are_ordered_and_bounded(values: list[float]) -> None:
    s = summarize(values)
    assert s.p50 is not None and s.p90 is not None and s.p99 is not None and s.mean is not None
    assert min(values) <= s.p50 <= s.p90 <= s.p99 <= max(values)


def test_rtf_is_audio_generation_time_over_audio_duration() -> None:
    record = RequestRecord(index=0, ok=True, last_audio=0.5, audio_seconds=2.0)
    assert record.rtf == 0.25
    assert RequestRecord(index=1, ok=True).rtf is None


def test_failed_requests_do_not_count_in_latency_or_throughput() -> None:
    good = RequestRecord(index=0, ok=True, ttft=0.1, e2e=1.0, itl=[0.01, 0.03], output_tokens=10, audio_seconds=3.0)
    bad = RequestRecord(index=1, ok=False, error="HTTP 500", ttft=9.0, output_tokens=99)
    summaries = latency_summaries([good, bad])
    assert summaries["ttft"].count == 1 and summaries["ttft"].mean == 0.1
    assert summaries["itl"].count == 2 and summaries["itl"].mean == pytest.approx(0.02)
    assert throughput([good, bad], 2.0) == {"requests_per_s": 0.5, "output_tokens_per_s": 5.0, "audio_seconds_per_s": 1.5}
