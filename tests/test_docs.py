"""The docs stay true: generated pages are current, the rule catalogue is complete, the
README stays short, and no page cites tracker numbers a reader cannot follow."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from omnictl.topology import validate_text
from omnictl.topology.catalog import RULES

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_reference_pages_are_current() -> None:
    gen = _gen_docs()
    stale = [str(path.relative_to(REPO)) for path in gen.stale()]
    assert not stale, f"stale generated docs {stale}: run {gen.COMMAND}"


def test_every_rule_the_validator_reports_is_catalogued() -> None:
    used: set[str] = set()
    for path in (REPO / "omnictl" / "topology").glob("*.py"):
        text = path.read_text()
        used |= set(re.findall(r'(?:report\.add|Issue|self\.issue)\(\s*"([a-z-]+)"', text))
        used |= set(re.findall(r'^\s+"(duplicate-key)", f"', text, flags=re.M))
    assert used, "the pattern finds the rule ids"
    assert used <= set(RULES), f"rule ids missing from omnictl.topology.catalog: {sorted(used - set(RULES))}"


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_each_catalogue_example_breaks_its_rule(rule_id: str) -> None:
    rule = RULES[rule_id]
    issues = validate_text(rule.example, "example.yaml", check_imports=rule.check_imports).issues
    assert rule_id in {i.rule for i in issues}, [i.format() for i in issues]


def test_readme_is_short() -> None:
    size = len((REPO / "README.md").read_bytes())
    assert size <= 12 * 1024, f"README.md is {size} bytes; move detail into docs/"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_tracker_numbers_in_the_docs(path: Path) -> None:
    found = re.findall(r"\b(?:issue|goal) \d+\b", path.read_text(), flags=re.I)
    assert not found, f"{path.name} cites {found}: say what the figure is, not which ticket asked"


def test_the_site_fetches_nothing_from_the_internet() -> None:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml names a Python callable (the Mermaid fence); only its name matters here
    Loader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda loader, suffix, node: suffix)
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=Loader)
    assert config["theme"]["font"] is False, "Material would load Google fonts"
    scripts = config.get("extra_javascript", []) + config.get("extra_css", [])
    assert not [s for s in scripts if "://" in str(s)], scripts
    # Material loads Mermaid from a CDN unless a `mermaid` is already on the page
    assert "assets/javascripts/mermaid.min.js" in scripts
    assert (REPO / "docs" / "assets" / "javascripts" / "mermaid.min.js").stat().st_size > 1_000_000
    for page in (REPO / "docs").rglob("*.md"):
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text()):
            assert "://" not in target, f"{page.name}: image {target} would be fetched"
