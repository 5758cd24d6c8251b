"""The docs point at things that exist (issue #52).

README.md and every Markdown file under docs/ are checked for two kinds of reference:

- **Relative links** (`[text](path)`, `![alt](path)`, with an optional `#anchor`): the target must exist, relative to
  the file that links to it, and an anchor into a Markdown file must be one of its headings (GitHub's slugs).
  Links with a scheme (`https:`, `mailto:`) are not ours to check.
- **Code paths named in backticks**: an inline code span that reads as a repository path must exist. A span reads as
  one when it is a single word of path characters with a `/` whose first segment is a top-level entry of the
  repository that git does not ignore (so `agents/store.py`, `tests/db/`, `.ci/run` and `bench/README.md` are checked;
  `/console/runs/`, `var/screenshots/x.png`, `http://…`, `tools/kinds/<kind>.py` and `python manage.py …` are not).
  A line suffix (`agents/models.py:148`), a pytest node id (`tests/db/test_x.py::test_y`) and an attribute after a
  module (`core/documents.document_field`) name the file they start with.

Fenced code blocks are examples, not references, and are skipped. The decision records' index must name every
record in docs/decisions/ (as a link, or as its slug in backticks while the record is being written elsewhere).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INDENTED_BLOCK = re.compile(r"(?:^(?: {4}|\t).*\n?)+", re.MULTILINE)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
PATH_WORD = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def without_code_blocks(text: str) -> str:
    text = FENCE.sub("", text)
    # An indented block after a blank line is code too (the release-safety guide's request examples).
    return re.sub(r"(\n\n)" + INDENTED_BLOCK.pattern, r"\1", text, flags=re.MULTILINE)


def heading_slugs(text: str) -> set[str]:
    """GitHub's anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    slugs: set[str] = set()
    seen: dict[str, int] = {}
    for title in HEADING.findall(FENCE.sub("", text)):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link in a heading keeps its text
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        slugs.add(slug if count == 0 else f"{slug}-{count}")
    return slugs


def ignored_names(root: Path) -> set[str]:
    """Top-level names .gitignore lists plainly (var/, .venv): generated, never referenced as the repo's files."""
    gitignore = root / ".gitignore"
    if not gitignore.exists():
        return set()
    names = set()
    for line in gitignore.read_text().splitlines():
        line = line.strip().strip("/")
        if line and not line.startswith("#") and not any(c in line for c in "*?[!/"):
            names.add(line)
    return names


def top_level_names(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.name != ".git"} - ignored_names(root)


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    problems = []
    text = doc.read_text()
    prose = CODE_SPAN.sub("", without_code_blocks(text))
    for target in LINK.findall(prose):
        if SCHEME.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.exists():
            problems.append(f"{doc.relative_to(root)}: link to {target!r}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in heading_slugs(dest.read_text()):
            problems.append(f"{doc.relative_to(root)}: link to {target!r}: no heading with that anchor in {dest.name}")
    return problems


def named_path(span: str, top: set[str]) -> str | None:
    """The repository path an inline code span names, or None when it names none."""
    span = span.strip().split("::", 1)[0]
    span = re.sub(r":\d+(?:-\d+)?$", "", span)
    if "/" not in span or not PATH_WORD.match(span):
        return None
    first = span.split("/", 1)[0]
    return span if first in top else None


def path_exists(path: str, root: Path) -> bool:
    if (root / path).exists():
        return True
    # `core/documents.document_field`: a module and an attribute of it.
    head, _, last = path.rpartition("/")
    module = last.split(".", 1)[0]
    return bool(module) and "." in last and (root / head / f"{module}.py").exists()


def missing_paths(doc: Path, root: Path = ROOT) -> list[str]:
    top = top_level_names(root)
    problems = []
    for _, span in CODE_SPAN.findall(without_code_blocks(doc.read_text())):
        path = named_path(span, top)
        if path is not None and not path_exists(path, root):
            problems.append(f"{doc.relative_to(root)}: `{span}` names {path}, which does not exist")
    return problems


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    assert broken_links(doc) == []


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_path_named_exists(doc: Path) -> None:
    assert missing_paths(doc) == []


def test_the_readme_is_a_front_page_and_the_guides_exist() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into a guide in docs/"
    guides = {"production", "api", "security", "flows", "release-safety", "extensions", "approvals", "performance"}
    assert {p.stem for p in (ROOT / "docs").glob("*.md")} >= guides


def test_the_decision_index_names_every_record() -> None:
    folder = ROOT / "docs" / "decisions"
    index = (folder / "README.md").read_text()
    records = sorted(p.stem for p in folder.glob("*.md") if p.name != "README.md")
    assert records, "no decision records"
    unnamed = [s for s in records if f"]({s}.md)" not in index and f"`{s}`" not in index]
    assert unnamed == [], f"docs/decisions/README.md does not list {unnamed}"


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "store.py").write_text("")
    (tmp_path / "var").mkdir()
    (tmp_path / ".gitignore").write_text("var/\n*.pyc\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# A guide\n\n## Connections and capacity\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/guide.md) [ok anchor](docs/guide.md#connections-and-capacity) [web](https://example.com/x)\n"
        "[gone](docs/nothing.md) [bad anchor](docs/guide.md#nowhere) ![shot](docs/missing.png)\n"
        "`agents/store.py` `agents/store.py:12` `agents/store.py::test_x` `agents/store.Store` `/console/runs/`\n"
        "`var/out.png` `tools/kinds/<kind>.py` `python agents/x.py` `agents/gone.py` `agents/old/`\n"
        "```\n[in a fence](docs/nothing-either.md) `agents/also_gone.py`\n```\n"
    )
    assert broken_links(doc, tmp_path) == [
        "README.md: link to 'docs/nothing.md': no such file",
        "README.md: link to 'docs/guide.md#nowhere': no heading with that anchor in guide.md",
        "README.md: link to 'docs/missing.png': no such file",
    ]
    assert missing_paths(doc, tmp_path) == [
        "README.md: `agents/gone.py` names agents/gone.py, which does not exist",
        "README.md: `agents/old/` names agents/old/, which does not exist",
    ]
