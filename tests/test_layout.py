"""The documentation cannot go stale: docs/layout.md's module map names every module of the package and nothing that
is gone, and every docs/ path or relative link that the repository's files give exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "detr"
LAYOUT = ROOT / "docs" / "layout.md"
MAP_SECTION = "## One line per module"

#: Where a docs/ path may be written: code, configs, benchmarks, tests, the docs themselves.
SOURCES = ("README.md", "Makefile", "hubconf.py", "pyproject.toml", "detr", "tools", "configs", "benchmarks", "tests",
           "docs")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".html", ".js", ".sh", ""}
DOCS_PATH = re.compile(r"docs/[\w./-]+?\.(?:md|png|jpg)")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def module_map_names() -> list[str]:
    """The paths the module map names, relative to detr/: "models/config.py", "data/" (a folder covers what it
    holds), "visualize/analysis_*.py" (a glob); "a.py, b.py" in one entry share the first one's folder."""
    text = LAYOUT.read_text(encoding="utf-8")
    assert MAP_SECTION in text, f"{LAYOUT} has no {MAP_SECTION!r} section"
    section = text.split(MAP_SECTION, 1)[1].split("\n## ", 1)[0]
    names = []
    for line in section.splitlines():
        if not re.match(r"    \S", line):  # an entry starts at the block's indent; its description continues deeper
            continue
        column = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        folder = ""
        for index, name in enumerate(part.strip() for part in column.split(",")):
            name = name.removeprefix("detr/")
            if index == 0:
                folder = name.rstrip("/").rpartition("/")[0] if "/" in name.rstrip("/") else ""
            elif "/" not in name.rstrip("/") and folder:
                name = f"{folder}/{name}"
            names.append(name)
    return names


def package_modules() -> list[Path]:
    """Every Python module under detr/, relative to it (a package's __init__.py is the package's own)."""
    return sorted(path.relative_to(PACKAGE) for path in PACKAGE.rglob("*.py")
                  if "__pycache__" not in path.parts and (path.name != "__init__.py" or path.parent == PACKAGE))


def named_paths(name: str) -> list[Path]:
    return sorted(PACKAGE.glob(name.rstrip("/"))) if "*" in name else [PACKAGE / name.rstrip("/")]


def test_the_module_map_names_every_module() -> None:
    covered: set[Path] = set()
    for name in module_map_names():
        for path in named_paths(name):
            covered.add(path.relative_to(PACKAGE))
    missing = [str(module) for module in package_modules()
               if not any(module == named or named in module.parents for named in covered)]
    assert not missing, (f"{LAYOUT.relative_to(ROOT)}'s {MAP_SECTION!r} names no entry for {missing}: add one line "
                         "per module (or its folder's line)")


def test_every_path_the_module_map_names_exists() -> None:
    gone = [name for name in module_map_names() if not all(path.exists() for path in named_paths(name))
            or not named_paths(name)]
    assert not gone, f"{LAYOUT.relative_to(ROOT)} names modules that do not exist under detr/: {gone}"


def test_the_module_map_parser_reads_entries_of_every_form() -> None:
    names = module_map_names()
    assert {"__init__.py", "models/config.py", "models/anchor/", "loss/focal.py", "loss/terms.py",
            "visualize/analysis_*.py", "visualize/explorer/"} <= set(names)


def source_files() -> list[Path]:
    files = []
    for source in SOURCES:
        path = ROOT / source
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            # tests/fixtures/ holds files as earlier versions wrote them (their comments name the docs of then)
            files.extend(file for file in path.rglob("*") if file.is_file() and file.suffix in SUFFIXES
                         and "__pycache__" not in file.parts and "fixtures" not in file.parts)
    return sorted(files)


def test_every_docs_path_in_the_repository_exists() -> None:
    broken = []
    for file in source_files():
        for path in set(DOCS_PATH.findall(file.read_text(encoding="utf-8", errors="replace"))):
            if not (ROOT / path).exists():
                broken.append(f"{file.relative_to(ROOT)}: {path}")
    assert not broken, f"paths to docs that do not exist (moved or renamed?): {sorted(broken)}"


def test_every_relative_link_in_the_docs_resolves() -> None:
    broken = []
    for file in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in MARKDOWN_LINK.findall(file.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:|#", target):
                continue
            if not (file.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{file.relative_to(ROOT)}: {target}")
    assert not broken, f"relative links that resolve to nothing: {sorted(broken)}"


#: The headings every family's page starts with, in this order (docs/guides/add-a-family.md).
FAMILY_TEMPLATE = ("What it is", "Load", "Train", "Export", "Parity measured", "Differences from the reference")


def test_every_family_page_follows_the_template() -> None:
    pages = sorted((ROOT / "docs" / "models").glob("*.md"))
    assert pages
    for page in pages:
        headings, fence = [], False
        for line in page.read_text(encoding="utf-8").splitlines():
            fence = fence != line.startswith("```")
            if not fence and line.startswith("## "):
                headings.append(line[3:].strip())
        assert tuple(headings[:len(FAMILY_TEMPLATE)]) == FAMILY_TEMPLATE, (
            f"{page.relative_to(ROOT)} starts with the headings {headings[:len(FAMILY_TEMPLATE)]}, not the families' "
            f"template {list(FAMILY_TEMPLATE)}")
