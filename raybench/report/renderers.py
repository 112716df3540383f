"""Every output format of a report, one class each, registered by name in `FORMATS`: the one list of formats.

`raybench results --format`, `raybench compare --format` and the files a benchmark writes its comparison in
(`compare.<suffix>`) all read `FORMATS`, so a new format is one class here (or a plug-in's), registered with
`@FORMATS.register("name")` and given its file `suffix`, with no other change. Each walks a
raybench.report.document.Document; the formats for people (text, Markdown, LaTeX) write its blocks, those for
machines (CSV, JSON) its dataset (`reads` says which).

Nothing heavy is imported here: the command line builds its flags from `FORMATS` before anything loads. CSV alone
imports pandas, when it writes.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from enum import Enum
from typing import ClassVar

from raybench.registry import Registry
from raybench.report.document import (
    Block,
    Cell,
    Column,
    Document,
    Heading,
    Legend,
    Lines,
    Mark,
    Measure,
    Missing,
    Table,
    TableKind,
    numeric,
)


class Part(str, Enum):
    """What of a Document a format writes: its blocks, its dataset's rows, or its dataset's tree."""

    BLOCKS = "blocks"
    ROWS = "rows"
    TREE = "tree"


class Renderer(ABC):
    """A format: writes a Document as text, under its file `suffix`. The formats for machines (CSV, JSON) write
    the document's data themselves; those for people are BlockRenderers."""

    suffix: ClassVar[str]  # the file suffix a benchmark writes this format under: `compare.<suffix>`
    reads: ClassVar[Part] = Part.BLOCKS

    @abstractmethod
    def render(self, document: Document) -> str:
        """The whole document in this format."""


class BlockRenderer(Renderer):
    """A format for people: it writes each kind of block (a heading, lines, a results table, a detail table), and
    the blocks' lines are joined, the page ending without a blank line. A subclass writes the two kinds of table."""

    def render(self, document: Document) -> str:
        lines: list[str] = []
        for block in document.blocks:
            lines += self.block(block)
        return "\n".join(lines).rstrip("\n")

    def block(self, block: Block) -> list[str]:
        if isinstance(block, Heading):
            return self.heading(block)
        if isinstance(block, Lines):
            return self.lines(block)
        return self.results(block) if block.kind == TableKind.RESULTS else self.detail(block)

    def heading(self, heading: Heading) -> list[str]:
        return [heading.text, ""]

    def lines(self, lines: Lines) -> list[str]:
        return list(lines.lines)

    @abstractmethod
    def results(self, table: Table) -> list[str]:
        """A RESULTS table's lines (raybench.report.document.TableKind)."""

    @abstractmethod
    def detail(self, table: Table) -> list[str]:
        """A DETAIL table's lines."""


FORMATS: Registry[type[Renderer]] = Registry("format")


def renderer(fmt_name: str) -> Renderer:
    """The format registered as `fmt_name`; an UnknownNameError naming it and the known ones."""
    return FORMATS.get(fmt_name)()


def render(document: Document, fmt_name: str) -> str:
    """The document in the format registered as `fmt_name`."""
    return renderer(fmt_name).render(document)


def suffix(fmt_name: str) -> str:
    """The file suffix the format is written under."""
    return FORMATS.get(fmt_name).suffix


def legend_line(legend: Legend, signs: dict[Mark, str], details: bool = True) -> str:
    """The legend in one line, each mark named by the format's `signs`: `** best OOD test acc; * within one std of
    it. Budget: ...`; without `details`, only what the essential cells need."""
    marks = "; ".join(f"{signs[mark]} {meaning}" for mark, meaning in legend.marks)
    parts = [marks + "." if marks and (legend.reading or details and legend.details) else marks, legend.reading,
             legend.details if details else ""]
    return " ".join(part for part in parts if part)


# ----- text: the console's -----------------------------------------------------------------------------------
ESCAPES = {"\t": "\\t", "\r": "\\r", "\n": "\\n"}  # a cell stays on its line


def one_line(text: str) -> str:
    """The text with its tabs and line breaks written as escapes, as pandas printed them."""
    return "".join(ESCAPES.get(ch, ch) for ch in text)


@FORMATS.register("table")
class TextRenderer(BlockRenderer):
    """Plain text for the terminal: each results table a grid of right-aligned cells, marks as ` **` (best) and
    ` *` (within one std), a group kept apart under its own heading; each detail table under `title:` with names
    read from the left and numbers lined up on the right."""

    suffix = "txt"
    SIGNS: ClassVar[dict[Mark, str]] = {Mark.BEST: "**", Mark.WITHIN: "*"}

    def results(self, table: Table) -> list[str]:
        out = [table.title, ""] if table.title else []
        for index, group in enumerate(table.groups):
            if index and group.heading:
                out += ["", f"{group.heading}:"]
            out += grid(table.columns, [[self.cell(c) for c in row] for row in group.rows]) if group.rows else \
                [group.empty] if group.empty else []
        out.append("")
        if table.legend or table.notes:
            out += [legend_line(table.legend, self.SIGNS)] if table.legend else []
            out += [*table.notes, ""]
        return out

    def detail(self, table: Table) -> list[str]:
        body = aligned(table) if table.rows else []
        title = [table.title + (":" if body else ".")] if table.title else []
        return [*title, *body, *table.notes, ""]

    def cell(self, cell: Cell) -> str:
        if isinstance(cell, Measure):
            return cell.plain() + (f" {self.SIGNS[cell.mark]}" if cell.mark else "")
        return cell.plain()


def grid(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    """The console's grid, as raybench's result tables have always printed: every cell right-aligned under its
    column's title, one space apart."""
    texts = [[one_line(c.title), *(one_line(row[i]) for row in rows)] for i, c in enumerate(columns)]
    widths = [max(len(text) for text in column) for column in texts]
    return [" ".join(column[line].rjust(width) for column, width in zip(texts, widths)) for line in range(len(rows) + 1)]


def aligned(table: Table) -> list[str]:
    """A detail table's lines, two spaces between columns: a column of numbers right-aligned, any other
    left-aligned (names and verdicts read from the left)."""
    texts = [[one_line(c.title), *(one_line(cell.plain()) for cell in table.column_cells(i))]
             for i, c in enumerate(table.columns)]
    widths = [max(len(text) for text in column) for column in texts]
    right = [numeric(table.column_cells(i)) for i in range(len(table.columns))]
    return ["  ".join(c[line].rjust(w) if r else c[line].ljust(w) for c, w, r in zip(texts, widths, right)).rstrip()
            for line in range(len(table.rows) + 1)]


# ----- Markdown --------------------------------------------------------------------------------------------
@FORMATS.register("markdown")
class MarkdownRenderer(BlockRenderer):
    """Markdown: each table a pipe table under its bold title (a results table's groups in one table), marks as
    bold (best) and italic (within one std), a detail table's notes as a list."""

    suffix = "md"
    SIGNS: ClassVar[dict[Mark, str]] = {Mark.BEST: "Bold:", Mark.WITHIN: "italic:"}
    EMPHASIS: ClassVar[dict[Mark, str]] = {Mark.BEST: "**{}**", Mark.WITHIN: "_{}_", Mark.NONE: "{}"}

    def heading(self, heading: Heading) -> list[str]:
        return [f"# {heading.text}", ""]

    def results(self, table: Table) -> list[str]:
        out = [f"**{table.title}**", ""] if table.title else []
        out += [*self.pipe_table(table), ""]
        if table.legend or table.notes:
            out += [legend_line(table.legend, self.SIGNS)] if table.legend else []
            out += [*table.notes, ""]
        return out

    def detail(self, table: Table) -> list[str]:
        out = [f"**{table.title}**", ""] if table.title else []
        out += [*self.pipe_table(table), ""] if table.rows else []
        return out + ([*(f"- {note}" for note in table.notes), ""] if table.notes else [])

    def pipe_table(self, table: Table) -> list[str]:
        lines = ["| " + " | ".join(c.title for c in table.columns) + " |", "|" + "---|" * len(table.columns)]
        return lines + ["| " + " | ".join(self.cell(c).replace("|", "\\|") for c in row) + " |" for row in table.rows]

    def cell(self, cell: Cell) -> str:
        if isinstance(cell, Measure):
            return self.EMPHASIS[cell.mark].format(cell.plain())
        return cell.plain()


# ----- LaTeX ----------------------------------------------------------------------------------------------
LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    """The text with every character LaTeX reads as markup written as itself."""
    return "".join(LATEX_SPECIALS.get(ch, ch) for ch in text)


@FORMATS.register("latex")
class LatexRenderer(BlockRenderer):
    """LaTeX: one booktabs tabular per table, ready to paste inside a table environment (needs
    \\usepackage{booktabs}); a results table keeps its essential columns, marks as \\textbf (best) and \\underline
    (within one std), a group after the first under its label; titles, legends, notes and prose as comments."""

    suffix = "tex"
    SIGNS: ClassVar[dict[Mark, str]] = {Mark.BEST: "bold:", Mark.WITHIN: "underlined:"}
    EMPHASIS: ClassVar[dict[Mark, str]] = {Mark.BEST: "\\textbf{{{}}}", Mark.WITHIN: "\\underline{{{}}}",
                                           Mark.NONE: "{}"}

    def heading(self, heading: Heading) -> list[str]:
        return [comment(heading.text), ""]

    def lines(self, lines: Lines) -> list[str]:
        return [comment(line) if line else "" for line in lines.lines]

    def results(self, table: Table) -> list[str]:
        keep = [i for i, c in enumerate(table.columns) if c.essential]
        head = [comment(_titled(table))] if table.title else []
        head += [comment(legend_line(table.legend, self.SIGNS, details=False))] if table.legend else []
        titles = [table.columns[i].title for i in keep]
        titles[:1] = [titles[0][:1].upper() + titles[0][1:]] if titles else []  # the row names' head, as a paper's
        out = [*head, *(comment(note) for note in table.notes), f"\\begin{{tabular}}{{l{'c' * (len(keep) - 1)}}}",
               "\\toprule", " & ".join(latex_escape(t) for t in titles) + " \\\\", "\\midrule"]
        for index, group in enumerate(table.groups):
            if index:
                out += ["\\midrule", f"\\multicolumn{{{len(keep)}}}{{l}}{{\\emph{{{latex_escape(group.label)}}}}} \\\\"]
            out += [" & ".join(self.cell(row[i]) for i in keep) + " \\\\" for row in group.rows]
        return out + ["\\bottomrule", "\\end{tabular}", ""]

    def detail(self, table: Table) -> list[str]:
        head = [comment(_titled(table)), *(comment(note) for note in table.notes)]
        if not table.rows:
            return [*head, ""]
        spec = "".join("r" if numeric(table.column_cells(i)) else "l" for i in range(len(table.columns)))
        rows = [" & ".join(self.cell(c) for c in row) + " \\\\" for row in table.rows]
        return [*head, f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
                " & ".join(latex_escape(c.title) for c in table.columns) + " \\\\", "\\midrule", *rows,
                "\\bottomrule", "\\end{tabular}", ""]

    def cell(self, cell: Cell) -> str:
        if isinstance(cell, Measure):
            return self.EMPHASIS[cell.mark].format(cell.plain(plus_minus="$\\pm$"))
        return "--" if isinstance(cell, Missing) else latex_escape(cell.text)


def comment(text: str) -> str:
    """A LaTeX comment line of the text, escaped as the tables' cells are."""
    return f"% {latex_escape(text)}"


def _titled(table: Table) -> str:
    return f"{table.context}: {table.title}" if table.context else table.title


# ----- for machines -------------------------------------------------------------------------------------------
@FORMATS.register("csv")
class CsvRenderer(Renderer):
    """CSV: one line per record of the document's dataset (a column per key, unrounded numbers), under a header."""

    suffix = "csv"
    reads = Part.ROWS

    def render(self, document: Document) -> str:
        import io

        import pandas as pd  # only here: the flags and the other formats need none of it

        buffer = io.StringIO()
        pd.DataFrame([dict(row) for row in document.dataset().rows]).to_csv(buffer, index=False)
        return buffer.getvalue().rstrip("\n")


@FORMATS.register("json")
class JsonRenderer(Renderer):
    """JSON: the document's dataset as one object (stable keys, unrounded numbers), indented by two."""

    suffix = "json"
    reads = Part.TREE

    def render(self, document: Document) -> str:
        return json.dumps(document.dataset().tree, indent=2, default=str)

