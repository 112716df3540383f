"""A report as typed blocks: what a page says, apart from how any one format writes it.

A builder (raybench.report.compare for `raybench compare`, raybench.report.results_text for `raybench results`, a
benchmark's summary) says what its page holds as a `Document`; each format of raybench.report.renderers walks any
Document the same way, so a new format is one renderer class and a new page is one builder, with no format written
out twice. The blocks are for people (the text table, Markdown, LaTeX); the document's `Dataset` is for machines
(CSV and JSON): stable keys and unrounded numbers, which a page that has none gets from its tables' cells.

Spacing is the blocks' own: a heading and a table are each followed by a blank line, `Lines` are written as they
are, blank lines included, and a page ends without one.

No pandas and no numpy here: the command line reads the formats' names (raybench.report.renderers) before anything
heavy loads.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Mark(str, Enum):
    """What a marked result cell is: the best of its column, or within one std of the best (WILDS Table 2)."""

    NONE = ""
    BEST = "best"
    WITHIN = "within one std"

    def __str__(self) -> str:  # the word itself, in f-strings and files
        return str(self.value)


def percent(value: float | None) -> str:
    """A fraction in % to one decimal: `55.0`; `n/a` for none or a non-finite one."""
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.1f}"


# ----- cells ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Text:
    """A cell of words, or of a number already written out (a count, a p-value, `+5.0`)."""

    text: str

    def plain(self) -> str:
        return self.text


@dataclass(frozen=True)
class Measure:
    """A mean ± std over replicates, of fractions shown in %, with the interval of the mean where one was computed
    and the cell's mark; each format writes its own ± and its own emphasis."""

    mean: float
    std: float  # NaN: one replicate, so no std is shown
    interval: tuple[float, float] | None = None  # (low, high) fractions
    mark: Mark = Mark.NONE

    def plain(self, plus_minus: str = "±") -> str:
        """`60.0 ± 2.0`, with an interval `60.0 ± 2.0 [55.0, 65.0]` (%); `plus_minus` is the format's sign."""
        text = f"{100 * self.mean:.1f}" + ("" if math.isnan(self.std) else f" {plus_minus} {100 * self.std:.1f}")
        return text + (f" [{percent(self.interval[0])}, {percent(self.interval[1])}]" if self.interval else "")


@dataclass(frozen=True)
class Missing:
    """No value for this cell (a column the row's sweep did not record)."""

    def plain(self) -> str:
        return "n/a"


Cell = Text | Measure | Missing

NUMBER = re.compile(r"^\[?[+-]?\d")  # 55.0, +5.0, [-1.2, +3.4], 3 vs 3


def numeric(cells: Sequence[Cell]) -> bool:
    """A column of numbers (or blanks, or n/a): right-aligned where a format aligns its columns by their content."""
    return all(NUMBER.match(text) or text in ("", "n/a") for text in (cell.plain() for cell in cells))


# ----- blocks ---------------------------------------------------------------------------------------------
class TableKind(str, Enum):
    """RESULTS: the numbers a page is for, under its heading, with a legend and the findings a reader must see
    beside them; its first column names the row. DETAIL: a titled table of plain text (a test, a ranking), with
    the notes that explain it."""

    RESULTS = "results"
    DETAIL = "detail"


@dataclass(frozen=True)
class Column:
    title: str
    # Kept by a format that shows a table's essentials only (LaTeX's: a paper's table of the result cells)
    essential: bool = True


@dataclass(frozen=True)
class RowGroup:
    """Rows that stand together: a table's ranked rows, or its analysis-only ones kept apart from them."""

    rows: tuple[tuple[Cell, ...], ...]
    heading: str = ""  # said above the group where a format sets it apart as a table of its own (the text table)
    label: str = ""  # the group's short name, where a format names it inside one table (LaTeX)
    empty: str = ""  # what a format that shows the group on its own says when it has no rows


@dataclass(frozen=True)
class Legend:
    """How to read a RESULTS table, in one line under it: what its marks mean, what else its essential cells carry
    (`reading`), and what its other columns mean (`details`, left out where they are)."""

    marks: tuple[tuple[Mark, str], ...] = ()  # (Mark.BEST, "best OOD test acc"), ...
    reading: str = ""
    details: str = ""


@dataclass(frozen=True)
class Table:
    title: str  # "" for none
    columns: tuple[Column, ...]
    groups: tuple[RowGroup, ...]
    kind: TableKind = TableKind.DETAIL
    legend: Legend | None = None
    notes: tuple[str, ...] = ()  # each a line: findings under a RESULTS table, explanations under a DETAIL one
    context: str = ""  # what the table belongs to (its dataset, the command), for a format that shows it apart

    @property
    def rows(self) -> tuple[tuple[Cell, ...], ...]:
        return tuple(row for group in self.groups for row in group.rows)

    def column_cells(self, index: int, rows: Sequence[Sequence[Cell]] | None = None) -> list[Cell]:
        return [row[index] for row in (self.rows if rows is None else rows)]


@dataclass(frozen=True)
class Heading:
    """The page's title."""

    text: str


@dataclass(frozen=True)
class Lines:
    """Prose, one line each, written as it is (blank lines included)."""

    lines: tuple[str, ...]


Block = Heading | Lines | Table


@dataclass(frozen=True)
class Dataset:
    """What a page says for machines: `rows`, one flat record each (CSV's lines), and `tree`, the whole (JSON)."""

    rows: tuple[Mapping[str, Any], ...]
    tree: Mapping[str, Any]

    @classmethod
    def of_tables(cls, tables: Sequence[Table]) -> Dataset:
        """A page without data of its own: each table row as a record of its cells, a measure as its unrounded
        mean and std (`TITLE.mean`, `TITLE.std`), no value as None."""
        rows = tuple({"table": table.title, **_record(table.columns, row)} for table in tables for row in table.rows)
        return cls(rows, {"rows": list(rows)})


def _record(columns: Sequence[Column], row: Sequence[Cell]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for column, cell in zip(columns, row):
        if isinstance(cell, Measure):
            record[f"{column.title}.mean"] = _finite(cell.mean)
            record[f"{column.title}.std"] = _finite(cell.std)
            if cell.interval:
                record.update({f"{column.title}.ci_low": _finite(cell.interval[0]),
                               f"{column.title}.ci_high": _finite(cell.interval[1])})
        else:
            record[column.title] = cell.text if isinstance(cell, Text) else None
    return record


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Document:
    blocks: tuple[Block, ...]
    data: Dataset | None = None  # None: the tables' cells are its data

    @property
    def tables(self) -> list[Table]:
        return [block for block in self.blocks if isinstance(block, Table)]

    def dataset(self) -> Dataset:
        return self.data if self.data is not None else Dataset.of_tables(self.tables)


def detail_table(title: str, records: Sequence[Mapping[str, str]], notes: Sequence[str] = (),
                 context: str = "") -> Table:
    """A DETAIL table from records of text by column title (the columns in the order the records first name them;
    a record without one of them has no value there)."""
    titles = list(dict.fromkeys(key for record in records for key in record))
    rows = tuple(tuple(Text(record[t]) if t in record else Missing() for t in titles) for record in records)
    return Table(title, tuple(Column(t) for t in titles), (RowGroup(rows),) if rows else (), TableKind.DETAIL,
                 notes=tuple(notes), context=context)
