"""List every dependency of omnictl's core install and of each extra with its licence, read
from the installed packages' own metadata (importlib.metadata), into docs/licences.md:

    .venv/bin/python scripts/gen_licences.py           # rewrite the generated part of docs/licences.md
    .venv/bin/python scripts/gen_licences.py --check   # exit 1 if the page is stale or the core install
                                                       # holds a copyleft or unknown licence

The dependency tree is walked from omnictl's requirements in pyproject.toml (the core install: no
extra; each extra: what it adds to the core) through each installed package's
requirements, markers evaluated for this machine. A package's licence is its SPDX
``License-Expression`` (PEP 639), else its ``License`` field when that is a licence's
name, else its ``License ::`` classifiers; what none of them names is ``UNKNOWN``.
Run it in the environment ``scripts/setup.sh`` made (every extra installed): a requirement
that is not installed is listed as such, not guessed. ``tests/test_licences.py`` runs the
same checks as ``--check``.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "licences.md"
COMMAND = ".venv/bin/python scripts/gen_licences.py"
START = "<!-- licences:start -->"
END = "<!-- licences:end -->"
CORE = "core"

# Licence names the `License` field and classifiers use, as SPDX identifiers.
ALIASES = {
    "apache": "Apache-2.0",
    "apache 2.0": "Apache-2.0",
    "apache 2.0 license": "Apache-2.0",
    "apache license 2.0": "Apache-2.0",
    "apache license, version 2.0": "Apache-2.0",
    "apache software license": "Apache-2.0",
    "apache-2": "Apache-2.0",
    "bsd": "BSD",
    "bsd license": "BSD",
    "bsd 3-clause license": "BSD-3-Clause",
    "3-clause bsd license": "BSD-3-Clause",
    "mit license": "MIT",
    "isc license": "ISC",
    "isc license (iscl)": "ISC",
    "python software foundation license": "PSF-2.0",
    "mozilla public license 2.0 (mpl 2.0)": "MPL-2.0",
    "the unlicense (unlicense)": "Unlicense",
    "lgpl": "LGPL",
    "gnu library or lesser general public license (lgpl)": "LGPL",
    "gnu lesser general public license v2 (lgplv2)": "LGPL-2.0",
    "gnu lesser general public license v3 (lgplv3)": "LGPL-3.0",
    "gnu general public license v2 (gplv2)": "GPL-2.0",
    "gnu general public license v3 (gplv3)": "GPL-3.0",
    "gnu general public license v3 or later (gplv3+)": "GPL-3.0-or-later",
    "gnu affero general public license v3": "AGPL-3.0",
    "other/proprietary license": "Proprietary",
}

# What each licence family asks of whoever ships it, from the least to the most.
PERMISSIVE, WEAK, STRONG, PROPRIETARY, UNKNOWN = (
    "permissive",
    "weak copyleft",
    "strong copyleft",
    "proprietary",
    "unknown",
)
NOT_INSTALLED = "not installed"
_WEAK = re.compile(r"^(LGPL|MPL|EPL|CDDL)", re.IGNORECASE)
_STRONG = re.compile(r"^(GPL|AGPL)", re.IGNORECASE)

# Copyleft licences accepted in the core install, each with why (the check fails on any other).
ACCEPTED_IN_CORE = {
    "certifi": "MPL-2.0 binds changes to certifi's own files; omnictl ships none and uses its CA bundle unmodified",
    "tqdm": "MPL-2.0 AND MIT: the same, for tqdm's own files (transformers' progress bars)",
}

# Strong-copyleft native libraries that wheels bundle (auditwheel's `<package>.libs/`, or
# beside the package's code), which no package metadata mentions: found by file name.
COPYLEFT_NATIVE = {
    "libx264": "GPL-2.0-or-later",
    "libx265": "GPL-2.0-or-later",
    "libpostproc": "GPL-2.0-or-later",
    "libespeak-ng": "GPL-3.0-or-later",
    "librubberband": "GPL-2.0-or-later",
}
# Those the core install is known to carry, each with why; the check fails on any other.
KNOWN_NATIVE_IN_CORE = {
    ("av", "libx264"): "PyAV's manylinux wheels link their FFmpeg against x264 (an H.264 encoder omnictl never uses)",
    ("av", "libx265"): "the same, for x265 (H.265)",
}


@dataclass(frozen=True)
class Package:
    name: str  # as the project spells it
    licence: str  # an SPDX expression, a family name (BSD), "Proprietary" or "UNKNOWN"
    kind: str  # PERMISSIVE ... UNKNOWN, or NOT_INSTALLED
    source: str  # the metadata field the licence was read from, or "licence file"
    native: tuple[str, ...] = ()  # the COPYLEFT_NATIVE libraries its files hold


def licence_of(distribution: metadata.Distribution) -> tuple[str, str]:
    """The package's licence and where it was read (see the module's docstring)."""
    meta = distribution.metadata
    expression = meta.get("License-Expression")
    if expression:
        return expression.strip(), "License-Expression"
    field = (meta.get("License") or "").strip()
    # a one-line name, or the first line of a licence's whole text ("MIT License\n\nCopyright ...")
    named = _named(field.splitlines()[0].strip()) if field else None
    if named is not None:
        return named, "License"
    found = []
    for classifier in meta.get_all("Classifier") or []:
        if classifier.startswith("License ::"):
            named = _named(classifier.rsplit("::", 1)[-1].strip())
            if named is not None and named not in found:
                found.append(named)
    if found:  # several: the package offers each (sniffio: MIT OR Apache-2.0)
        return " OR ".join(found), "classifiers"
    return _from_licence_file(distribution), "licence file"


# The first words of the licence texts met without any metadata naming them.
_TEXTS = [
    ("Apache-2.0", re.compile(r"Apache License\s+Version 2\.0")),
    ("MIT", re.compile(r"Permission is hereby granted, free of charge")),
    ("BSD-style", re.compile(r"Redistribution and use in source and binary forms")),
]


def _from_licence_file(distribution: metadata.Distribution) -> str:
    """The licence whose text the package's own licence file holds, else UNKNOWN."""
    for name in distribution.metadata.get_all("License-File") or []:
        for candidate in (f"licenses/{name}", name):
            text = distribution.read_text(candidate)
            if text is not None:
                for licence, pattern in _TEXTS:
                    if pattern.search(text[:3000]):
                        return licence
    return "UNKNOWN"


def _native(distribution: metadata.Distribution) -> tuple[str, ...]:
    """The COPYLEFT_NATIVE libraries among the package's installed files."""
    held = set()
    for file in distribution.files or []:
        name = file.name
        if ".so" in name or name.endswith((".dylib", ".dll")):
            held.update(lib for lib in COPYLEFT_NATIVE if name.startswith((lib + "-", lib + ".")))
    return tuple(sorted(held))


def _named(text: str) -> str | None:
    alias = ALIASES.get(text.lower())
    if alias is not None:
        return alias
    try:
        return canonicalize_license_expression(text)
    except InvalidLicenseExpression:
        return None


def kind_of(licence: str) -> str:
    """The licence family an expression falls in: for ``A OR B`` the user may pick the
    gentler; for ``A AND B`` both bind, so the stricter counts."""
    if licence == "UNKNOWN":
        return UNKNOWN
    order = [PERMISSIVE, WEAK, STRONG, PROPRIETARY]
    alternatives = [part.strip(" ()") for part in re.split(r"\s+OR\s+", licence)]
    chosen = []
    for alternative in alternatives:
        terms = [term.split(" WITH ")[0].strip(" ()") for term in re.split(r"\s+AND\s+", alternative)]
        chosen.append(max((_kind_of_term(term) for term in terms), key=order.index))
    return min(chosen, key=order.index)


def _kind_of_term(term: str) -> str:
    if term == "Proprietary":
        return PROPRIETARY
    if _STRONG.match(term):
        return STRONG
    if _WEAK.match(term):
        return WEAK
    return PERMISSIVE


def _requirements(name: str, extras: frozenset[str]) -> list[Requirement]:
    """What the installed ``name`` requires on this machine, with ``extras`` asked of it."""
    return _applicable([Requirement(line) for line in metadata.distribution(name).requires or []], extras)


def _applicable(requirements: list[Requirement], extras: frozenset[str]) -> list[Requirement]:
    """The requirements whose markers hold here, for the base install and ``extras``."""
    environments = [{"extra": extra} for extra in ("", *sorted(extras))]
    return [r for r in requirements if r.marker is None or any(r.marker.evaluate(e) for e in environments)]


def _closure(requirements: list[Requirement]) -> dict[str, Package]:
    found: dict[str, Package] = {}
    todo = list(requirements)
    asked: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement = todo.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in asked:
            continue
        asked.add(key)
        try:
            meta = metadata.distribution(requirement.name).metadata
        except metadata.PackageNotFoundError:
            found.setdefault(key[0], Package(requirement.name, "-", NOT_INSTALLED, "not installed here"))
            continue
        distribution = metadata.distribution(requirement.name)
        licence, source = licence_of(distribution)
        found[key[0]] = Package(meta["Name"], licence, kind_of(licence), source, _native(distribution))
        todo.extend(_requirements(requirement.name, key[1]))
    return found


def groups() -> dict[str, list[Package]]:
    """The core install's packages, then for each extra the packages it adds to the core.

    omnictl's own requirements are read from pyproject.toml, the source, rather than from
    its installed metadata, which an editable install leaves as it was at install time."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = _closure(_applicable([Requirement(line) for line in project["dependencies"]], frozenset()))
    result = {CORE: sorted(core.values(), key=lambda p: p.name.lower())}
    for extra, lines in project.get("optional-dependencies", {}).items():
        own = _applicable([Requirement(line) for line in lines], frozenset())
        added = {name: package for name, package in _closure(own).items() if name not in core}
        result[extra] = sorted(added.values(), key=lambda p: p.name.lower())
    return result


def core_problems(core: list[Package]) -> list[str]:
    """Each package of the core install whose licence is copyleft (and not accepted with a
    reason in ACCEPTED_IN_CORE), proprietary or unknown, named with its licence."""
    return [
        f"{package.name}: {package.licence} ({package.kind})"
        for package in core
        if package.kind != PERMISSIVE and canonicalize_name(package.name) not in ACCEPTED_IN_CORE
    ]


def core_native(core: list[Package]) -> list[str]:
    """Each strong-copyleft native library in the core install that KNOWN_NATIVE_IN_CORE
    does not list, named with its package and licence."""
    return [
        f"{package.name} bundles {lib} ({COPYLEFT_NATIVE[lib]})"
        for package in core
        for lib in package.native
        if (canonicalize_name(package.name), lib) not in KNOWN_NATIVE_IN_CORE
    ]


def render(found: dict[str, list[Package]]) -> str:
    """The generated part of docs/licences.md: a summary per group, then every package."""
    out = [
        START,
        f"<!-- Generated by `{COMMAND}` from the installed packages' metadata. Do not edit: "
        "rerun it (tests/test_licences.py fails while this part is stale). -->",
        "",
        "| install | packages | by licence family | copyleft, proprietary or unknown |",
        "|---|---|---|---|",
    ]
    for group, packages in found.items():
        families: dict[str, int] = {}
        for package in packages:
            families[package.kind] = families.get(package.kind, 0) + 1
        counted = ", ".join(f"{count} {kind}" for kind, count in sorted(families.items()))
        flagged = ", ".join(f"{p.name} ({p.licence})" for p in packages if p.kind != PERMISSIVE) or "none"
        label = "`pip install omnictl`" if group == CORE else f"`omnictl[{group}]` adds"
        out.append(f"| {label} | {len(packages)} | {counted or '-'} | {flagged} |")
    out += [
        "",
        "Strong-copyleft native libraries inside the wheels (no package metadata names them):",
        "",
        "| install | package | library | licence |",
        "|---|---|---|---|",
    ]
    for group, packages in found.items():
        for package in packages:
            for lib in package.native:
                out.append(f"| {group} | {package.name} | {lib} | {COPYLEFT_NATIVE[lib]} |")
    for group, packages in found.items():
        title = "The core install" if group == CORE else f"The `{group}` extra (what it adds to the core)"
        out += ["", f"### {title}", "", "| package | licence | family | read from |", "|---|---|---|---|"]
        for package in packages:
            out.append(f"| {package.name} | {package.licence.replace('|', '/')} | {package.kind} | {package.source} |")
    out.append(END)
    return "\n".join(out)


def page_with(text: str, generated: str) -> str:
    """``text`` (the page) with its generated part replaced by ``generated``."""
    if START not in text or END not in text:
        raise SystemExit(f"{PAGE.relative_to(ROOT)}: no {START} ... {END} section to fill in")
    head, rest = text.split(START, 1)
    return head + generated + rest.split(END, 1)[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale or the core is not clean")
    args = parser.parse_args()
    found = groups()
    current = PAGE.read_text(encoding="utf-8")
    wanted = page_with(current, render(found))
    problems = core_problems(found[CORE]) + core_native(found[CORE])
    for problem in problems:
        print(f"core install: {problem}: not a permissive licence", file=sys.stderr)
    if args.check:
        if wanted != current:
            print(f"{PAGE.relative_to(ROOT)} is stale: run {COMMAND}", file=sys.stderr)
            return 1
        return 1 if problems else 0
    PAGE.write_text(wanted, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}: " + ", ".join(f"{g} {len(p)}" for g, p in found.items()))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
