"""The licence audit (scripts/gen_licences.py, docs/licences.md): the core install holds no
copyleft, proprietary or unknown licence beyond the ones accepted with a reason, the page is
current, and the classification that decides it reads licences as their metadata writes them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_licences", REPO / "scripts" / "gen_licences.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its own module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def found(gen: ModuleType) -> dict[str, list]:
    return gen.groups()


def test_the_core_install_has_no_copyleft_proprietary_or_unknown_licence(gen: ModuleType, found: dict) -> None:
    problems = gen.core_problems(found[gen.CORE]) + gen.core_native(found[gen.CORE])
    assert problems == [], (
        f"the core install (pip install omnictl) gained {problems}: drop the dependency, or accept it "
        "in scripts/gen_licences.py with the reason and say so in docs/licences.md"
    )


def test_the_licences_page_is_current(gen: ModuleType, found: dict) -> None:
    current = gen.PAGE.read_text(encoding="utf-8")
    assert gen.page_with(current, gen.render(found)) == current, f"docs/licences.md is stale: run {gen.COMMAND}"


def test_the_page_says_the_demo_extra_brings_gpl_piper(gen: ModuleType, found: dict) -> None:
    piper = [p for p in found["demo"] if p.name == "piper-tts"]
    assert piper and piper[0].kind == gen.STRONG and piper[0].licence.startswith("GPL-3.0")
    text = gen.PAGE.read_text(encoding="utf-8")
    head = text.split(gen.START)[0]
    assert "GPL-3.0-or-later" in head and "espeak-ng" in head and "Serving without Piper" in head


def test_a_gpl_or_unknown_package_in_the_core_is_named(gen: ModuleType) -> None:
    core = [
        gen.Package("fine", "MIT", gen.kind_of("MIT"), "License-Expression"),
        gen.Package("certifi", "MPL-2.0", gen.kind_of("MPL-2.0"), "License"),  # accepted, with its reason
        gen.Package("gplthing", "GPL-3.0-or-later", gen.kind_of("GPL-3.0-or-later"), "License"),
        gen.Package("lgplthing", "LGPL-2.1-only", gen.kind_of("LGPL-2.1-only"), "License-Expression"),
        gen.Package("mystery", "UNKNOWN", gen.kind_of("UNKNOWN"), "licence file"),
        gen.Package("av", "BSD-3-Clause", gen.PERMISSIVE, "License-Expression", ("libx264", "libpostproc")),
    ]
    assert gen.core_problems(core) == [
        "gplthing: GPL-3.0-or-later (strong copyleft)",
        "lgplthing: LGPL-2.1-only (weak copyleft)",
        "mystery: UNKNOWN (unknown)",
    ]
    assert gen.core_native(core) == ["av bundles libpostproc (GPL-2.0-or-later)"]


@pytest.mark.parametrize(
    "licence,kind",
    [
        ("Apache-2.0 AND Apache-2.0 WITH LLVM-exception AND BSD-3-Clause", "permissive"),
        ("MIT OR GPL-3.0-only", "permissive"),  # the user may take the gentler
        ("MPL-2.0 AND MIT", "weak copyleft"),  # both bind
        ("GPL-2.0-or-later", "strong copyleft"),
        ("AGPL-3.0-only", "strong copyleft"),
        ("Proprietary", "proprietary"),
        ("UNKNOWN", "unknown"),
    ],
)
def test_licence_families(gen: ModuleType, licence: str, kind: str) -> None:
    assert gen.kind_of(licence) == kind


def test_licences_are_read_from_expression_field_classifiers_or_file(gen: ModuleType, tmp_path: Path) -> None:
    import importlib.metadata as metadata

    def dist(name: str, headers: str, licence_text: str | None = None) -> metadata.Distribution:
        info = tmp_path / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.4\nName: {name}\nVersion: 1.0\n{headers}")
        if licence_text is not None:
            (info / "licenses").mkdir()
            (info / "licenses" / "LICENSE").write_text(licence_text)
        return metadata.PathDistribution(info)

    assert gen.licence_of(dist("a", "License-Expression: MIT\nLicense: GPL\n")) == ("MIT", "License-Expression")
    assert gen.licence_of(dist("b", "License: Apache 2.0\n")) == ("Apache-2.0", "License")
    assert gen.licence_of(dist("c", "License: GPL-3.0-or-later\n")) == ("GPL-3.0-or-later", "License")
    classifiers = "Classifier: License :: OSI Approved :: MIT License\nClassifier: License :: OSI Approved :: Apache Software License\n"
    assert gen.licence_of(dist("d", classifiers)) == ("MIT OR Apache-2.0", "classifiers")
    mit = "Permission is hereby granted, free of charge, to any person obtaining a copy"
    assert gen.licence_of(dist("e", "License-File: LICENSE\n", mit)) == ("MIT", "licence file")
    assert gen.licence_of(dist("f", "License-File: LICENSE\n", "All rights reserved.")) == ("UNKNOWN", "licence file")
