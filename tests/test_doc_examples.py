"""Every block the docs mark runnable runs as written.

A fenced ``bash`` or ``python`` block right after a ``<!-- runnable -->`` line, in the README
or any page under ``docs/``, is executed from the repository root with the venv's ``bin`` on
``PATH`` (so ``omnictl`` and ``.venv/bin/omnictl`` both work) and must exit 0: a renamed flag
or a changed API breaks this test, not a reader.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARK = "<!-- runnable -->"
FENCE = re.compile(r"^```(\w+)\s*$")

pytestmark = pytest.mark.timeout(180)


@dataclass(frozen=True)
class Block:
    file: Path
    line: int  # of the opening fence
    language: str
    code: str

    def __str__(self) -> str:
        return f"{self.file.relative_to(REPO)}:{self.line}"


def runnable_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks = []
    for index, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        fence = FENCE.match(lines[index + 1]) if index + 1 < len(lines) else None
        if fence is None:
            raise AssertionError(f"{path}:{index + 1}: {MARK} must be followed by a fenced block")
        end = next(i for i in range(index + 2, len(lines)) if lines[i].strip() == "```")
        blocks.append(Block(path, index + 2, fence.group(1), "\n".join(lines[index + 2:end]) + "\n"))
    return blocks


PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCKS = [block for page in PAGES for block in runnable_blocks(page)]


def block_id(block: Block) -> str:
    """A block's test id: its page and its place among the page's runnable blocks
    (``README.md#1``), not its line, so that an edit higher up the page leaves the id, and
    its entry in tests/slow_tests.txt, as they were (failures still name the line)."""
    same_page = [b for b in BLOCKS if b.file == block.file]
    return f"{block.file.relative_to(REPO)}#{same_page.index(block) + 1}"


def test_the_docs_mark_examples_runnable() -> None:
    assert len(BLOCKS) >= 4, [str(b) for b in BLOCKS]
    assert {b.language for b in BLOCKS} == {"bash", "python"}
    assert any(b.file.name == "README.md" for b in BLOCKS)


def run_block(block: Block, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Runs ``block`` as a reader would: from the repository root, the venv's ``bin`` first on
    ``PATH``; bash with ``-euo pipefail`` (a failing line fails the block)."""
    if block.language not in ("bash", "python"):
        pytest.fail(f"{block}: only bash and python blocks can be marked runnable")
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)}
    if block.language == "bash":
        command = ["bash", "-euo", "pipefail", "-c", block.code]
    else:
        script = tmp_path / "example.py"
        script.write_text(block.code)
        command = [sys.executable, str(script)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=170)


def test_marked_blocks_are_found_and_run_as_written_and_a_failing_line_fails_one(tmp_path: Path) -> None:
    """The runner itself, on a page of its own, in well under a second (the docs' own
    blocks start servers and pipelines: most are `slow`)."""
    page = tmp_path / "page.md"
    page.write_text("Text.\n<!-- runnable -->\n```bash\nfalse\necho after\n```\n"
                    "<!-- runnable -->\n```python\nimport sys\nprint(sys.executable)\n```\n"
                    "```bash\nexit 3  # not marked: not run\n```\n")
    failing, python = runnable_blocks(page)
    assert (failing.language, failing.line, python.language, python.line) == ("bash", 3, "python", 8)
    assert python.code == "import sys\nprint(sys.executable)\n"
    ran = run_block(failing, tmp_path)
    assert ran.returncode == 1 and "after" not in ran.stdout  # -e: the failing line ends it
    assert run_block(python, tmp_path).stdout == sys.executable + "\n"  # the venv's python
    which = run_block(Block(page, 1, "bash", "command -v omnictl\n"), tmp_path)
    assert which.stdout == str(Path(sys.executable).parent / "omnictl") + "\n"  # the venv's omnictl first
    (tmp_path / "unfenced.md").write_text("<!-- runnable -->\nNo fence here.\n")
    with pytest.raises(AssertionError, match="must be followed by a fenced block"):
        runnable_blocks(tmp_path / "unfenced.md")


def _three_stages_prints_its_answer(stdout: str) -> None:
    lines = stdout.splitlines()
    assert lines[0] == "HIHI"
    assert lines[1:9] == [f"stream detokenize {c}" for c in "OMNIOMNI"]
    assert lines[9] == "result detokenize OMNIOMNI"


# What a block must print besides exiting 0, by a command it holds: the example's run is
# checked here, once, as the page shows it (it was run a second time by a test of its own).
PRINTS = {"cd examples/three_stages && ../../.venv/bin/python run.py": _three_stages_prints_its_answer}


def test_each_output_check_has_its_block() -> None:
    """A check whose command left the docs would pass by never running: each holds one block."""
    for command in PRINTS:
        assert [str(b) for b in BLOCKS if command in b.code] != [], f"no runnable block runs {command!r}"


@pytest.mark.parametrize("block", BLOCKS, ids=block_id)
def test_runnable_block(block: Block, tmp_path: Path) -> None:
    out = run_block(block, tmp_path)
    assert out.returncode == 0, f"{block} exited {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    for command, check in PRINTS.items():
        if command in block.code:
            check(out.stdout)
