"""Every relative link in the user docs reaches a file of this repository (and its heading, when it names one).

Issue 27 found ``recipes/slime/README.md`` sending readers to a ``frameworks.md`` that is not in
the repository. This reads every Markdown link in ``README.md``, ``CHANGELOG.md``,
``docs/*.md``, ``packages/*/README.md`` and ``recipes/**/README.md``; links to the web are
left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("packages/*/README.md"),
        *ROOT.glob("recipes/**/README.md"),
    ]
)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def _links(doc: Path) -> list[str]:
    return [m[1] for m in _LINK.finditer(_FENCE.sub("", doc.read_text(encoding="utf-8")))]


def test_the_docs_are_read() -> None:
    assert len(DOCS) >= 15 and sum(len(_links(d)) for d in DOCS) >= 20


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for link in _links(doc):
        if re.match(r"^[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link}: no heading #{anchor}")
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


_NAMED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
#: Basenames of every Markdown file in the repository.
_IN_REPO = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts and "node_modules" not in p.parts}


@pytest.mark.parametrize(
    "doc", [d for d in DOCS if d.name != "internals.md"], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_files_named_in_prose_exist(doc: Path) -> None:
    """A ``.md`` file named in the text (``frameworks.md §1.2``) is one a reader can open; the spec's are said to be."""
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    missing = [
        m[1]
        for m in _NAMED.finditer(text)
        if Path(m[1]).name not in _IN_REPO and "spec" not in text[max(0, m.start() - 16) : m.end()]
    ]
    assert not missing, f"{doc.relative_to(ROOT)} names files that are not in the repository: {missing}"


#: A backticked Markdown file name (``docs/cli.md``, ``cli.md#views``, ``snapshot-format.md §2``), not a glob.
_TICKED = re.compile(r"`((?:[\w.-]+/)*[\w-][\w.-]*\.md)(?:[#§ ][^`\n]*)?`")


def ticked_md_missing(text: str, doc: Path) -> list[str]:
    """The backticked ``*.md`` names of ``text`` (``doc``'s) that name no file of the repository.

    A name resolves against the doc's folder or the root, and a bare name (``cli.md``) may be
    any file of that name. Names under ``shared/`` (the contributors' spec and design beside
    the repository, said to lie there by their path) are left alone.
    """
    missing = []
    for match in _TICKED.finditer(_FENCE.sub("", text)):
        name = match[1]
        if "shared/" in name:
            continue
        if "/" not in name and name in _IN_REPO:
            continue
        places = [(base / name).resolve() for base in (doc.parent, ROOT)]
        if not any(place.is_file() and place.is_relative_to(ROOT) for place in places):
            missing.append(name)
    return missing


def test_the_ticked_name_check_catches_what_it_is_for() -> None:
    doc = ROOT / "docs" / "internals.md"
    text = (
        "see `interface.md` §3, `cli.md#views`, `docs/cli.md`, `../README.md`, `frameworks.md §1`, "
        "`shared/spec/service-api.md`, `docs/*.md`, `.md`\n```\n`inside-a-fence.md`\n```\n"
    )
    assert ticked_md_missing(text, doc) == ["interface.md", "frameworks.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_ticked_md_names_exist(doc: Path) -> None:
    """Issue 33: docs/internals.md sent readers to an ``interface.md`` the repository does not hold."""
    missing = ticked_md_missing(doc.read_text(encoding="utf-8"), doc)
    assert not missing, f"{doc.relative_to(ROOT)} names Markdown files that are not in the repository: {missing}"
