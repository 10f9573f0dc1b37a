"""The load generator behind ``omnictl bench``."""

from __future__ import annotations

from omnictl.bench.runner import BenchConfig, BenchError, run_bench

__all__ = ["BenchConfig", "BenchError", "run_bench"]
