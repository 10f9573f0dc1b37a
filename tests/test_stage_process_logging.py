"""A stage process's logging (omnictl.logs.configure_stage_process): what its code logs,
warns or crashes with is one tagged record each, on stderr and in its log file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROGRAM = """
import logging, sys, warnings
from pathlib import Path
from omnictl.logs import configure_stage_process, request_scope
configure_stage_process("INFO", sys.argv[1], "tts#1", Path(sys.argv[2]))
logging.getLogger("omnictl.stage.stage").info("stage ready")
logging.getLogger("some.library").info("chatty detail")  # a library's INFO: left out
with request_scope("req-7"):
    logging.getLogger("user_code").warning("slow voice")
warnings.warn("deprecated knob")
raise RuntimeError("model exploded")
"""


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_records_warnings_and_a_crash_are_tagged_with_the_replica_on_stderr_and_in_the_file(
        fmt: str, tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "tts#1.log"
    result = subprocess.run([sys.executable, "-c", PROGRAM, fmt, str(log_file)], cwd=REPO, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1
    assert result.stderr == log_file.read_text()  # the same records, in the same format
    assert result.stderr.count("Traceback (most recent call last)") == 1  # the crash, once
    if fmt == "json":
        records = [json.loads(line) for line in result.stderr.splitlines()]
        assert [(r["level"], r["process"], r["request_id"]) for r in records] == [
            ("INFO", "tts#1", "-"), ("WARNING", "tts#1", "req-7"), ("WARNING", "tts#1", "-"), ("CRITICAL", "tts#1", "-")]
        assert "deprecated knob" in records[2]["message"]
        assert "model exploded" in records[3]["traceback"]
    else:
        lines = [line for line in result.stderr.splitlines() if line[:4].isdigit()]
        assert len(lines) == 4 and all("[tts#1]" in line for line in lines), result.stderr
        assert "request=req-7: slow voice" in lines[1] and "deprecated knob" in lines[2]
        assert "CRITICAL" in lines[3] and "RuntimeError: model exploded" in result.stderr
    assert "chatty detail" not in result.stderr
