"""The documentation site (mkdocs.yml) has a place for every page, and the README points into it.

`scripts/test` builds the site with `mkdocs build --strict`, which fails on a broken link or anchor; these checks
are the ones a build cannot make or would make too late: a page added to docs/ without a place in the navigation
(mkdocs only warns, and the page is then reachable from nowhere), and a command added to `vcsched` that the
README's usage never mentions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"
README = ROOT / "README.md"


def _config() -> dict[str, Any]:
    config = yaml.safe_load(MKDOCS.read_text())
    assert isinstance(config, dict), f"{MKDOCS}: not a mapping"
    return config


def nav_pages(nav: Any) -> list[str]:
    """Every page path named in a mkdocs `nav` (nested sections, titled or bare entries), in order."""
    if isinstance(nav, str):
        return [] if re.match(r"^[a-z]+://", nav) else [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    raise AssertionError(f"mkdocs.yml nav: unexpected entry {nav!r}")


def excluded_pages(config: dict[str, Any]) -> set[str]:
    """The pages `not_in_nav` names (one gitignore-style path a line; only plain paths are used here)."""
    lines = str(config.get("not_in_nav") or "").splitlines()
    return {line.strip().lstrip("/") for line in lines if line.strip() and not line.strip().startswith("#")}


def test_nav_helpers_read_sections_and_bare_entries() -> None:
    nav = ["index.md", {"A": "a.md"}, {"B": [{"C": "b/c.md"}, "d.md", {"Ext": "https://example.org/"}]}]
    assert nav_pages(nav) == ["index.md", "a.md", "b/c.md", "d.md"]
    assert excluded_pages({"not_in_nav": "/x.md\n\n  y/z.md\n# comment\n"}) == {"x.md", "y/z.md"}


def test_every_docs_page_has_a_place_in_the_site() -> None:
    config = _config()
    assert config.get("docs_dir") == "docs"
    in_nav = nav_pages(config["nav"])
    excluded = excluded_pages(config)
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    missing = [p for p in pages if p not in in_nav and p not in excluded]
    assert not missing, (
        f"docs page(s) {', '.join(missing)} have no place in the site: add each to `nav` in mkdocs.yml under the "
        "task it serves (e.g. `- Failures and recovery: [failures.md, <page>]`), or, if it is only a part of "
        "another page, to `not_in_nav` with a link to it from that page"
    )


def test_every_nav_entry_is_a_page_once() -> None:
    config = _config()
    in_nav = nav_pages(config["nav"])
    absent = [p for p in in_nav if not (DOCS / p).is_file()]
    assert not absent, f"mkdocs.yml nav names page(s) that docs/ does not have: {', '.join(absent)}"
    twice = sorted({p for p in in_nav if in_nav.count(p) > 1})
    assert not twice, f"mkdocs.yml nav lists page(s) more than once: {', '.join(twice)}"
    both = sorted(set(in_nav) & excluded_pages(config))
    assert not both, f"page(s) both in mkdocs.yml's nav and in not_in_nav: {', '.join(both)}"
    assert in_nav[0] == "index.md", "the site's first page is its introduction, docs/index.md"


def _readme_usage() -> str:
    text = README.read_text()
    start = text.index("\n## Usage")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_readme_usage_shows_every_command() -> None:
    usage = _readme_usage()
    missing = [name for name in sorted(COMMANDS) if not re.search(rf"\bvcsched {re.escape(name)}\b", usage)]
    assert not missing, (
        f"README.md's Usage never shows `vcsched {', vcsched '.join(missing)}`: add one line for each "
        "(the command and what it is for) to the code blocks under ## Usage"
    )


def test_readme_links_the_site() -> None:
    text = README.read_text()
    for page in ("docs/index.md", "docs/rules.md", "docs/cli.md"):
        assert f"]({page})" in text, f"README.md does not link {page}"
    assert "mkdocs serve" in text, "README.md does not say how to serve the documentation site"
