"""Tables that fit the terminal: columns move to a second table by priority, free text wraps; nothing is cut or lost.

rich squeezes a table that is wider than the terminal by cutting its cells
(``0.5…``, ``vCP…``): a number that is cut is a wrong number.  Instead, each
column has a priority (0: always kept; a higher number goes first).  When the
table is wider than the space it is printed in, the column with the highest
priority number (the rightmost among equals) leaves, and again, until the
rest fits; :func:`keep_by_priority` is that rule, and ``vcsched top``'s screen
(cli/top_view.py) uses it too.  What left goes to a second table beside the
*key* columns (the ones that name a row: host, VM), fitted the same way, and
what still does not fit to a third, and so on.  A column of free text (a
reason, a "why") is declared ``wrap=True``: it counts as at most
:data:`WRAP_WIDTH` characters wide and rich wraps its cells, so a long reason
stays beside its row instead of pushing the row's numbers away.  A column
too wide to stand even beside the keys is printed below the tables, one line
per row (``web-0 why: ...``): at any width every value is shown, in full.
``--json`` has every field.

:class:`FitTable` is a drop-in for :class:`rich.table.Table` (``add_column``,
``add_row``, ``console.print(table)``) with ``priority`` and ``key`` on its
columns; a column without a priority gets its position (the first one, 0,
stays; the later ones leave first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text


def keep_by_priority(priorities: Sequence[int], widths: Sequence[int], room: int, gap: int) -> list[int]:
    """The indexes of the columns that stay (in order) when columns of ``widths`` separated by ``gap`` characters
    must fit in ``room``: the highest priority number leaves first, the rightmost among equals; 0 never leaves."""
    kept = list(range(len(widths)))

    def total() -> int:
        return sum(widths[i] for i in kept) + gap * max(len(kept) - 1, 0)

    while total() > room:
        droppable = [i for i in kept if priorities[i] > 0]
        if not droppable:
            break
        kept.remove(max(droppable, key=lambda i: (priorities[i], i)))
    return kept


@dataclass
class _Column:
    header: str
    justify: str
    priority: int
    key: bool
    style: str | None
    wrap: bool = False


#: The width a ``wrap=True`` column is counted at when the table is fitted: room for a few words a line.
WRAP_WIDTH = 24
#: What a rich table with the default box spends per column (a border and a space of padding each side) and
#: once more for the closing border: ``│ a │ b │``.
_PER_COLUMN, _EDGE = 3, 1


@dataclass
class FitTable:
    """A table that fits the width it is printed in (module docstring)."""

    title: str | None = None
    caption: str | None = None
    overflow_title: str | None = None  # the second table's title (default: the first's, "continued")
    columns: list[_Column] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def add_column(self, header: str, *, justify: str = "left", priority: int | None = None, key: bool = False,
                   style: str | None = None, wrap: bool = False, **_ignored: Any) -> None:
        """As :meth:`rich.table.Table.add_column`; ``priority`` (module docstring), ``key`` (repeated in the
        second table to name each row) and ``wrap`` (free text, wrapped rather than moved) besides.  rich's own
        sizing arguments are ignored: cells are never cut."""
        self.columns.append(_Column(header, justify, len(self.columns) if priority is None else priority, key, style,
                                    wrap))

    def add_row(self, *cells: Any) -> None:
        self.rows.append(cells)

    def _widths(self) -> list[int]:
        def width(cell: Any) -> int:
            text = cell if isinstance(cell, Text) else Text.from_markup(str(cell))
            return max((len(line) for line in text.plain.splitlines()), default=0)

        def fitted(i: int, c: _Column) -> int:
            natural = max([*(len(line) for line in c.header.splitlines()), *(width(r[i]) for r in self.rows)])
            return min(natural, WRAP_WIDTH) if c.wrap else natural

        return [fitted(i, c) for i, c in enumerate(self.columns)]

    def _table(self, title: str | None, indexes: Sequence[int], caption: str | None = None) -> Table:
        table = Table(title=title, caption=caption)
        for i in indexes:
            c = self.columns[i]
            table.add_column(c.header, justify=c.justify, style=c.style, no_wrap=not c.wrap,  # type: ignore[arg-type]
                             overflow="fold" if c.wrap else "ellipsis")
        for row in self.rows:
            table.add_row(*(row[i] for i in indexes))
        return table

    def split(self, room: int) -> tuple[list[list[int]], list[int]]:
        """The columns of each table (the first, then each continuation: the keys, then what did not fit before)
        and those that fit in none (a column wider than the room beside the keys)."""
        widths = [w + _PER_COLUMN for w in self._widths()]
        room -= _EDGE
        priorities = [0 if c.key else c.priority for c in self.columns]
        tables = [keep_by_priority(priorities, widths, room, 0)]
        keys = [i for i, c in enumerate(self.columns) if c.key] or [0]
        moved = [i for i in range(len(self.columns)) if i not in tables[0]]
        while moved:
            # In a continuation the keys stay (priority 0) and the moved columns keep their order of importance.
            candidates = [*keys, *moved]
            kept = [candidates[i] for i in keep_by_priority(
                [0 if i < len(keys) else max(priorities[j], 1) for i, j in enumerate(candidates)],
                [widths[j] for j in candidates], room, 0)]
            if len(kept) == len(keys):
                break
            tables.append(kept)
            moved = [i for i in moved if i not in kept]
        return tables, moved

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        tables, left_out = self.split(options.max_width)
        more = self.overflow_title or (f"{self.title.split(' (')[0]} (continued)" if self.title else None)
        for n, indexes in enumerate(tables):
            last = n == len(tables) - 1 and not left_out
            yield self._table(self.title if n == 0 else more, indexes, self.caption if last else None)
        yield from self._below(left_out)

    def _below(self, left_out: Sequence[int]) -> RenderResult:
        """The columns too wide for any table, one line per row and column: the row's keys, the header, the value
        (wrapped by the console like any line)."""
        keys = [i for i, c in enumerate(self.columns) if c.key] or [0]
        for row in self.rows:
            for i in left_out:
                line = Text(" ".join(Text.from_markup(str(row[k])).plain for k in keys) + " ", style="bold")
                line.append(f"{self.columns[i].header}: ", style="dim")
                line.append(row[i] if isinstance(row[i], Text) else Text.from_markup(str(row[i])))
                yield line
