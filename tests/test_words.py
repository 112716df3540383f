"""Every closed word list is declared once, in raybench.words, and read everywhere else: a copy written into
another module (a parser's choices, a file check, a registry) is found here, by reading the source's literals.
The output formats are the one list declared elsewhere, by their registry (raybench.report.renderers.FORMATS: a
class per format), and no module writes their names out either."""
from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from raybench import words
from raybench.report.renderers import FORMATS

PACKAGE = Path(words.__file__).resolve().parent
LISTS = {"executors": words.EXECUTORS, "samplers": words.SAMPLERS, "schedulers": words.SCHEDULERS,
         "selection rules": tuple(words.SELECTION_RULES), "formats": tuple(FORMATS.names())}


def constant(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant)


def literal_word_sets(tree: ast.AST) -> list[tuple[int, frozenset[str]]]:
    """(line, words) of every tuple, list or set of two or more strings, and of every dict with such string keys
    and constant values (a word table). A dict from the words to code (the samplers' factories) is the registry
    that implements them, checked against the declared words below."""
    found = []
    for node in ast.walk(tree):
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else \
            node.keys if isinstance(node, ast.Dict) and all(constant(v) for v in node.values) else None
        if items and len(items) >= 2 and all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            found.append((node.lineno, frozenset(i.value for i in items)))
    return found


@pytest.mark.parametrize("name", LISTS)
def test_a_word_list_is_written_out_only_in_raybench_words(name):
    wanted = frozenset(LISTS[name])
    copies = [f"{path.relative_to(PACKAGE.parent)}:{line}"
              for path in sorted(PACKAGE.rglob("*.py")) if path.name != "words.py"
              for line, found in literal_word_sets(ast.parse(path.read_text(encoding="utf-8"))) if found == wanted]
    assert copies == [], (f"the {name} are written out again at {copies}; read raybench.words (the formats: "
                          f"raybench.report.renderers.FORMATS) instead")


def flag_choices(command: str, flag: str) -> tuple[str, ...]:
    """The words `raybench COMMAND FLAG` accepts, read off the command line's own parser."""
    from raybench.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return tuple(next(a.choices for a in commands.choices[command]._actions if flag in a.option_strings))


def test_the_registries_and_flags_are_built_from_the_declared_words():
    from raybench.report.stats import RULES
    from raybench.sweep import options, sampling
    from raybench.sweep.selection import SELECTIONS

    assert tuple(sampling.SAMPLERS) == words.SAMPLERS
    assert flag_choices("results", "--format") == flag_choices("compare", "--format") == tuple(FORMATS.names())
    assert not any(name.endswith("FORMATS") for name in vars(words))  # the registry is their one definition
    assert sorted(SELECTIONS.names()) == sorted(words.SELECTION_RULES)
    assert tuple(str(rule) for rule in RULES) == tuple(words.SELECTION_RULES)
    choices = {field.name: flag.choices for field, flag in options.flagged()}
    assert choices["executor"] == words.EXECUTORS and choices["sampler"] == words.SAMPLERS
    assert choices["scheduler"] == words.SCHEDULERS and choices["selection"] == tuple(words.SELECTION_RULES)


def test_mlflows_run_statuses_are_spelled_only_where_tracking_declares_them():
    """RUNNING, FINISHED, KILLED and FAILED as words: raybench.tracking.names declares them (RUN_*), the sweep and
    the benchmark end their runs with those names."""
    statuses = {"RUNNING", "FINISHED", "KILLED", "FAILED"}
    spelled = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
               for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).as_posix() != "tracking/names.py"
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.Constant) and node.value in statuses]
    assert spelled == []


def test_a_sweeps_stage_words_are_declared_once_and_tracking_tags_runs_with_them():
    from raybench.tracking import names

    assert (names.SEARCH_STAGE, names.REPLICATE_STAGE) == (words.SEARCH_STAGE, words.REPLICATE_STAGE)
    compared = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                for path in sorted(PACKAGE.rglob("*.py")) if path.name != "words.py"
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value == words.REPLICATE_STAGE
                                                         for c in node.comparators)]
    assert compared == [], "a stage compared with its word written out: read raybench.words"
