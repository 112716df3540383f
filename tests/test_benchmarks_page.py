"""benchmarks/README.md is read by its headings: other pages, docstrings and comments name its sections (the page's
path followed by a quoted heading, a parenthesised list of quoted headings, or an anchor), and the table of
docs/reference/measurements.md lists them by name. A renamed or removed heading leaves those references pointing at
nothing without any build noticing (the page is outside the docs site), so every reference must name a heading that
exists. The page also names behaviours, never tracker numbers, which mean nothing to a reader outside the tracker."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE_PATH = "benchmarks/README.md"
PAGE = REPO / PAGE_PATH
MEASUREMENTS = REPO / "docs" / "reference" / "measurements.md"
SCANNED = ("README.md", "Makefile", "mkdocs.yml", "docs", "raybench", "benchmarks", "tests", "cluster", "examples",
           ".ci")
SKIPPED_DIRS = {"__pycache__", ".git", ".venv", "site", "node_modules"}
LARGEST_SCANNED_BYTES = 2_000_000
# After the path: the closing marks of inline code or a markdown link, then the heading's name or names.
CLOSERS = re.compile(r"[`)\]]*\s*")
ONE_NAME = re.compile(r',\s*"([^"]+)"')
NAME_LIST = re.compile(r'\(\s*("[^"]+"(?:\s*,\s*"[^"]+")*)')
ANCHOR = re.compile(r"#([\w-]+)")
QUOTED = re.compile(r'"([^"]+)"')
# A quoted name may wrap onto a comment's or docstring's next line.
LINE_CONTINUATION = re.compile(r"\n[ \t]*(?:#+[ \t]?)?")
TRACKER_NUMBER = re.compile(r"#\d+|[Ii]ssue \d+")
INTERNAL_LINK = re.compile(r"\]\(#([^)\s]+)\)")
HEADING_LINE = re.compile(r"#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$")
# Where a quoted name may end inside a longer heading: "ASHA" names "ASHA against FIFO".
NAME_ENDS = " :,"


@dataclass(frozen=True)
class HeadingReference:
    """One place that points into the page: by a heading's name, or by its anchor."""

    source: str
    name: str | None = None
    anchor: str | None = None


def page_headings(text: str) -> list[str]:
    """The text of every markdown heading outside fenced code blocks, in order."""
    headings: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING_LINE.match(line)
        if match:
            headings.append(match.group(1))
    return headings


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def page_anchors(headings: list[str]) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 ... for repeated ones."""
    anchors: set[str] = set()
    for heading in headings:
        slug = base = github_slug(heading)
        repeat = 0
        while slug in anchors:
            repeat += 1
            slug = f"{base}-{repeat}"
        anchors.add(slug)
    return anchors


def names_heading(name: str, heading: str) -> bool:
    """Whether a quoted name is the heading, or its first words ("Scientific check" for "Scientific check (...)")."""
    return heading == name or (heading.startswith(name) and heading[len(name)] in NAME_ENDS)


def references_in(text: str, source: str) -> list[HeadingReference]:
    """The heading references that follow each mention of the page's path in one file's text."""
    references: list[HeadingReference] = []
    for mention in re.finditer(re.escape(PAGE_PATH), text):
        line = text.count("\n", 0, mention.start()) + 1
        where = f"{source}:{line}"
        rest = text[mention.end():mention.end() + 400]
        anchor = ANCHOR.match(rest)
        if anchor:
            references.append(HeadingReference(where, anchor=anchor.group(1)))
            continue
        rest = LINE_CONTINUATION.sub(" ", rest[CLOSERS.match(rest).end():])
        one, listed = ONE_NAME.match(rest), NAME_LIST.match(rest)
        names = [one.group(1)] if one else QUOTED.findall(listed.group(1)) if listed else []
        references += [HeadingReference(where, name=" ".join(name.split())) for name in names]
    return references


def scanned_files() -> list[Path]:
    """The repository's files that may point into the page, this test's own file aside."""
    files: list[Path] = []
    for root in SCANNED:
        path = REPO / root
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p for p in candidates if not SKIPPED_DIRS.intersection(p.relative_to(REPO).parts)
                  and p.stat().st_size <= LARGEST_SCANNED_BYTES and p.resolve() != Path(__file__).resolve()]
    return files


def repository_references() -> list[HeadingReference]:
    """Every heading reference in the scanned files (binary files skipped)."""
    references: list[HeadingReference] = []
    for path in scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        references += references_in(text, str(path.relative_to(REPO)))
    return references


def measurements_table_references() -> list[HeadingReference]:
    """The section names in the first column of docs/reference/measurements.md's table of the page."""
    lines = MEASUREMENTS.read_text(encoding="utf-8").splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| section of") and PAGE_PATH in line)
    references: list[HeadingReference] = []
    for offset, line in enumerate(lines[header + 2:], header + 3):
        if not line.startswith("|"):
            break
        cell = line.split("|")[1].strip()
        source = f"{MEASUREMENTS.relative_to(REPO)}:{offset}"
        references += [HeadingReference(source, name=name.strip()) for name in cell.split("; ")]
    return references


def unresolved(references: list[HeadingReference], headings: list[str]) -> list[HeadingReference]:
    """The references that name no heading of the page."""
    anchors = page_anchors(headings)
    return [ref for ref in references
            if (ref.anchor is not None and ref.anchor not in anchors)
            or (ref.name is not None and not any(names_heading(ref.name, heading) for heading in headings))]


def test_the_reference_shapes_are_read():
    text = ('see benchmarks/README.md, "Sweep overhead").\n'
            '# the figures: (benchmarks/README.md, "One trial\n# queue")\n'
            '[benchmarks/README.md](benchmarks/README.md) ("The first", "the\n    second")\n'
            '`benchmarks/README.md` ("`make test`")\n'
            "[the suite](benchmarks/README.md#make-test)\n"
            "benchmarks/README.md has the table.\n")
    found = [(ref.name, ref.anchor) for ref in references_in(text, "x")]
    assert found == [("Sweep overhead", None), ("One trial queue", None), ("The first", None),
                     ("the second", None), ("`make test`", None), (None, "make-test")]


def test_a_name_is_a_heading_or_its_first_words():
    assert names_heading("ASHA", "ASHA against FIFO")
    assert names_heading("Scientific check", "Scientific check")
    assert names_heading("text-shift", "text-shift: ERM calibration")
    assert not names_heading("ASH", "ASHA against FIFO")
    assert not names_heading("Sweep overhead", "Sweep")


def test_every_reference_into_the_page_names_one_of_its_headings():
    references = repository_references() + measurements_table_references()
    known = [ref for ref in references if ref.source.startswith("Makefile:") and ref.name == "`make test`"]
    assert known, "the scan found not even the Makefile's reference"
    missing = unresolved(references, page_headings(PAGE.read_text(encoding="utf-8")))
    assert not missing, "\n".join(f"{ref.source}: {ref.name or '#' + str(ref.anchor)}" for ref in missing)


def test_the_suites_section_keeps_its_exact_name():
    """Pages link to it as the page's `make-test` anchor, which any longer heading would change."""
    assert "`make test`" in page_headings(PAGE.read_text(encoding="utf-8"))


def test_the_pages_own_links_name_its_headings():
    text = PAGE.read_text(encoding="utf-8")
    anchors = page_anchors(page_headings(text))
    links = INTERNAL_LINK.findall(text)
    assert links, "the page's index links to no section"
    assert not [link for link in links if link not in anchors]


def test_the_page_names_no_tracker_numbers():
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    numbered = [f"{number}: {line}" for number, line in enumerate(lines, 1) if TRACKER_NUMBER.search(line)]
    assert not numbered, "\n".join(numbered)
