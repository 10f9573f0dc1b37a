"""Human-readable figures shared by the waterfall, the dashboard and the status line."""

from __future__ import annotations


def format_seconds(seconds: float | None) -> str:
    """``0.42 ms``, ``12.3 ms``, ``1.25 s``; ``-`` when there is no figure."""
    if seconds is None:
        return "-"
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 0.1:
        return f"{seconds * 1e3:.2f} ms"
    if seconds < 10:
        return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
    return f"{seconds:.1f} s"


def format_bytes(count: float | None) -> str:
    if count is None:
        return "-"
    value, unit = float(count), "B"
    for larger in ("KB", "MB", "GB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"


def format_rate(per_second: float) -> str:
    return f"{per_second:.1f}" if per_second < 100 else f"{per_second:.0f}"


def format_byte_rate(bytes_per_s: float | None) -> str:
    """``0 B/s``, ``512 B/s``, ``3.4 kB/s``, ``12.0 MB/s``, ``1.25 GB/s`` (decimal units):
    a unit picked by size, so a few kilobytes a second do not read ``0.00``."""
    if bytes_per_s is None:
        return "-"
    value = float(bytes_per_s)
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if value < 1000 or unit == "GB/s":
            return f"{value:.0f} {unit}" if unit == "B/s" else f"{value:.{2 if value < 10 else 1}f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")
