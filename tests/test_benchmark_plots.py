"""`--plot` on the benchmark scripts: the figures of the table, drawn into a PNG."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
matplotlib = pytest.importorskip("matplotlib")  # in the dev extra; the scripts import it only with --plot


def _shm_module():  # benchmarks/ is scripts, not a package
    spec = importlib.util.spec_from_file_location("bench_shm", REPO / "benchmarks" / "shm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shm_plot_draws_the_tables_figures(tmp_path: Path) -> None:
    shm = _shm_module()
    mib = shm.MiB
    # medians in ns per transfer; GB/s = bytes / ns
    medians = {4 * mib: {label: [4 * mib / 6.0, 4 * mib / 7.0] for label in shm.LABELS},
               64 * mib: {label: [64 * mib / 9.5] for label in shm.LABELS}}
    out = tmp_path / "shm.png"
    shm.plot(medians, out, "2026-12-01, test figures")
    from PIL import Image

    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (800, 450)
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 10, "something is drawn"


def test_plot_without_matplotlib_fails_before_measuring(tmp_path: Path) -> None:
    # a python whose matplotlib import fails: the script must refuse at once, saying how to get it
    blocker = tmp_path / "matplotlib.py"
    blocker.write_text("raise ImportError('blocked for the test')\n")
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "shm.py"), "--quick", "--plot", str(tmp_path / "x.png")],
                         capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and "--plot needs matplotlib" in out.stderr, out.stderr
