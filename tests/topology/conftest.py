"""Helpers for topology tests: validate dedented YAML text and pick issues by rule."""

from __future__ import annotations

import textwrap
from typing import Callable

import pytest

from omnictl.topology import Issue, validate_text

Lint = Callable[..., list[Issue]]


@pytest.fixture
def lint() -> Lint:
    """``lint(yaml_text, rule=None)``: the issues found (only ``rule``'s when given)."""

    def run(text: str, rule: str | None = None, check_imports: bool = False) -> list[Issue]:
        report = validate_text(textwrap.dedent(text).lstrip("\n"), "t.yaml",
                               check_imports=check_imports)
        return [i for i in report.issues if rule is None or i.rule == rule]

    return run
