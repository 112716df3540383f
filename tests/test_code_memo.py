"""The code memo (raybench.code_memo): a text that depends on raybench's code alone is computed once per version of
that code, and never read for another version, nor from a damaged file."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from raybench import code_memo


@pytest.fixture
def package(tmp_path, monkeypatch) -> Path:
    """A small package standing in for raybench's own files, its version computed afresh for each test."""
    root = tmp_path / "pkg"
    (root / "algorithms").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "algorithms" / "erm.py").write_text("LR = 0.1\n")
    (root / "data.yaml").write_text("a: 1\n")
    monkeypatch.setattr(code_memo, "PACKAGE", root)
    monkeypatch.setenv("RAYBENCH_CACHE_DIR", str(tmp_path / "memo"))
    code_memo.code_version.cache_clear()
    yield root
    code_memo.code_version.cache_clear()


class Computations:
    """A compute function that counts its calls and answers with the text it is given."""

    def __init__(self, text: str) -> None:
        self.text, self.calls = text, 0

    def __call__(self) -> str:
        self.calls += 1
        return self.text


def new_version() -> None:
    code_memo.code_version.cache_clear()


def test_a_text_is_computed_once_per_code_version(package):
    compute = Computations("erm  empirical risk minimisation")
    assert code_memo.code_text("list algorithms", compute) == compute.text
    assert code_memo.code_text("list algorithms", Computations("never asked")) == compute.text
    assert compute.calls == 1
    assert code_memo.memo_file().parent == package.parent / "memo"


@pytest.mark.parametrize("change", ["edit a module", "add a module", "edit a data file", "rename a module"])
def test_any_change_to_the_packages_files_is_a_new_version_and_the_text_is_computed_again(package, change):
    code_memo.code_text("list settings", Computations("old"))
    before = code_memo.code_version()
    if change == "edit a module":
        (package / "algorithms" / "erm.py").write_text("LR = 0.2\n")
    elif change == "add a module":
        (package / "algorithms" / "flooding.py").write_text("")
    elif change == "edit a data file":
        (package / "data.yaml").write_text("a: 2\n")
    else:
        (package / "algorithms" / "erm.py").rename(package / "algorithms" / "erm2.py")
    new_version()
    assert code_memo.code_version() != before
    assert code_memo.code_text("list settings", Computations("new")) == "new"


def test_compiled_bytecode_is_not_part_of_the_version(package):
    before = code_memo.code_version()
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "erm.cpython-311.pyc").write_bytes(b"\x00\x01")
    new_version()
    assert code_memo.code_version() == before


@pytest.mark.parametrize("damage", ["", "{cut", "[]", '{"list settings": 3}'])
def test_a_damaged_memo_is_recomputed_and_repaired(package, damage):
    memo = code_memo.memo_file()
    memo.parent.mkdir(parents=True)
    memo.write_text(damage)
    compute = Computations("trainer settings")
    assert code_memo.code_text("list settings", compute) == "trainer settings"
    assert code_memo.code_text("list settings", compute) == "trainer settings"
    assert compute.calls == 1


def test_a_memo_that_cannot_be_written_still_answers(package, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RAYBENCH_CACHE_DIR", str(blocker / "memo"))  # below a file: no folder can be made
    compute = Computations("space text")
    assert code_memo.code_text("space new erm", compute) == "space text"
    assert code_memo.code_text("space new erm", compute) == "space text"
    assert compute.calls == 2


def test_only_the_most_recently_written_versions_are_kept(package, monkeypatch):
    monkeypatch.setattr(code_memo, "KEPT", 3)
    written = []
    for edit in range(5):
        (package / "algorithms" / "erm.py").write_text(f"LR = {edit}\n")
        new_version()
        code_memo.code_text("list settings", Computations(f"text {edit}"))
        written.append(code_memo.memo_file())
        os.utime(written[-1], (edit, edit))  # written in this order, whatever the file system's clock resolution
    assert sorted(code_memo.memo_dir().glob("code-memo-*.json")) == sorted(written[-3:])


def test_the_memo_folder_follows_xdg_when_raybench_names_none(package, tmp_path, monkeypatch):
    monkeypatch.delenv("RAYBENCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert code_memo.memo_dir() == tmp_path / "xdg" / "raybench"


def test_the_installed_package_is_what_is_hashed():
    assert code_memo.PACKAGE == Path(code_memo.__file__).parent
    assert (code_memo.PACKAGE / "cli.py").is_file()


def test_a_copy_of_the_package_with_one_more_algorithm_has_another_version(tmp_path, monkeypatch):
    copy = tmp_path / "raybench"
    shutil.copytree(code_memo.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(code_memo, "PACKAGE", copy)
    new_version()
    same = code_memo.code_version()
    (copy / "algorithms" / "flooding.py").write_text('"""Flooding."""\n')
    new_version()
    try:
        assert code_memo.code_version() != same
    finally:
        monkeypatch.undo()
        new_version()
