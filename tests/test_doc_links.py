"""Every link to a section of the docs resolves: `docs/<file>.md#<anchor>` in the repository's .py and .md files
(code comments point to measurements that way), and `[text](<file>.md#<anchor>)` or `[text](#anchor)` in its
.md files, relative to the file. An anchor is a heading's GitHub slug. Reads text only: no model."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"build", "dist", "node_modules", "__pycache__", "site-packages"}

ROOTED = re.compile(r"(?<![\w./-])(docs/[\w./-]+?\.md)#([\w-]+)")
MD_LINK = re.compile(r"\]\(([^)\s#]*?\.md)?#([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def repo_files(suffixes: tuple[str, ...]) -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).parts
        if any(p.startswith(".") or p in SKIP_DIRS for p in rel[:-1]):
            continue
        if path.suffix in suffixes and path.is_file():
            found.append(path)
    return sorted(found)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation dropped, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
    return frozenset(found)


def links() -> list[tuple[str, Path, str]]:
    """(where, target file, anchor) for every section link in the repository."""
    out = []
    for path in repo_files((".py", ".md")):
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(ROOT).as_posix()
        for m in ROOTED.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{rel}:{line}", ROOT / m.group(1), m.group(2)))
        if path.suffix == ".md":
            for m in MD_LINK.finditer(text):
                if "://" in (m.group(1) or ""):
                    continue
                line = text.count("\n", 0, m.start()) + 1
                target = (path.parent / m.group(1)).resolve() if m.group(1) else path
                out.append((f"{rel}:{line}", target, m.group(2)))
    return out


def test_the_slug_is_githubs():
    assert slug("Gemma 3's split: S = 6, chosen by tune") == "gemma-3s-split-s--6-chosen-by-tune"
    assert slug("Late K/V in 2,048-row blocks") == "late-kv-in-2048-row-blocks"
    assert slug("Gemma 3 at 16K and 32K: memory, follow-ups, ΔNLL") == "gemma-3-at-16k-and-32k-memory-follow-ups-δnll"


def test_every_section_link_resolves():
    found = links()
    assert len(found) > 100, "the scan found too few links: has the layout moved?"
    broken = []
    for where, target, anchor in found:
        if not target.is_file():
            broken.append(f"{where}: {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target} "
                          f"does not exist")
        elif anchor not in anchors(target):
            broken.append(f"{where}: no heading {anchor!r} in {target.relative_to(ROOT)}")
    assert not broken, "broken section links:\n" + "\n".join(broken)


def test_the_measurement_index_lists_every_section():
    index = (ROOT / "docs" / "MEASUREMENTS.md").read_text(encoding="utf-8")
    for topic in sorted((ROOT / "docs" / "measurements").glob("*.md")):
        assert f"measurements/{topic.name})" in index, f"the index does not list {topic.name}"
        for anchor in anchors(topic):
            if not anchor.startswith("measurements-"):  # the topic file's own title
                assert f"measurements/{topic.name}#{anchor})" in index, f"the index does not list {topic.name}#{anchor}"


def test_every_relative_file_link_in_the_docs_exists():
    """`[text](path.md)` and `![alt](path.png)` in the .md files: a moved or renamed file breaks none."""
    missing = []
    for path in repo_files((".md",)):
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in re.finditer(r"\]\(([^)\s#:]+\.(?:md|png|jpg|svg))(?:#[^)\s]*)?\)", text):
            if not (path.parent / m.group(1)).exists():
                line = text.count("\n", 0, m.start()) + 1
                missing.append(f"{path.relative_to(ROOT).as_posix()}:{line}: {m.group(1)}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)
