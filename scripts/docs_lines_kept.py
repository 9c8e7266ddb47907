"""Which lines of an old documentation page are nowhere in docs/ now: the check for moving a page's content
into other pages (issue 40 split docs/operations.md into task pages).

    python3 scripts/docs_lines_kept.py <(git show REV:docs/operations.md) docs [--skip operations.md]

A line counts as kept when, with link syntax reduced to its text and emphasis, heading marks and line breaks
ignored, it is a line of some page or a piece of a page's running text.  What is printed was rewritten or merged:
read each one and say where it went.  Exit 0 always: the list is for a person to judge.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def flat(s: str) -> str:
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = s.replace("*", "").replace("#", "")
    return re.sub(r"\s+", " ", s).strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", help="the old page (a file, or <(git show REV:path))")
    ap.add_argument("docs", type=Path, help="the directory of the new pages")
    ap.add_argument("--skip", action="append", default=[], help="a page of docs/ not to count (e.g. the old page)")
    a = ap.parse_args()
    old = Path(a.old).read_text().splitlines()
    lines: set[str] = set()
    text = ""
    for p in sorted(a.docs.glob("*.md")):
        if p.name in a.skip:
            continue
        t = p.read_text()
        lines.update(flat(line) for line in t.splitlines())
        text += " " + flat(t)
    left = 0
    for i, line in enumerate(old, 1):
        s = flat(line)
        if len(s) < 4 or s.startswith("```") or set(s) <= set("|- "):
            continue
        if s not in lines and s not in text:
            print(f"{i}: {line}")
            left += 1
    print(f"{left} of {len(old)} lines rewritten or merged", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
