"""The bounded memory of finished request ids."""

from __future__ import annotations

import subprocess
import sys

import pytest

from omnictl.recent import DEFAULT_RECENT_IDS, RecentIds


def test_it_holds_at_most_capacity_ids_and_forgets_the_oldest_first() -> None:
    recent = RecentIds(capacity=3)
    for rid in ("a", "b", "c", "d"):
        recent.add(rid)
    assert len(recent) == 3
    assert "a" not in recent
    assert all(rid in recent for rid in ("b", "c", "d"))
    recent.add("e")
    assert "b" not in recent and "e" in recent


def test_re_adding_an_id_refreshes_it() -> None:
    recent = RecentIds(capacity=3)
    for rid in ("a", "b", "c"):
        recent.add(rid)
    recent.add("a")  # "a" is the newest again: "b" is now the oldest
    assert len(recent) == 3
    recent.add("d")
    assert "a" in recent and "b" not in recent


def test_the_default_capacity_and_invalid_capacities() -> None:
    recent = RecentIds()
    assert recent.capacity == DEFAULT_RECENT_IDS
    for index in range(DEFAULT_RECENT_IDS + 10):
        recent.add(f"r{index}")
    assert len(recent) == DEFAULT_RECENT_IDS and "r9" not in recent and "r10" in recent
    with pytest.raises(ValueError, match="capacity"):
        RecentIds(0)


def test_it_imports_nothing_heavy() -> None:
    code = "import sys, omnictl.recent; heavy = {'torch', 'numpy', 'zmq', 'msgspec'} & set(sys.modules); print(sorted(heavy))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == "[]"
