"""What a path is, found without opening it: a file raybench reads or replaces must be a regular file.

Opening a FIFO blocks until something writes to it (`raybench data check` on a root whose metadata.csv was a FIFO
hung for ever); a socket or a device is no data file either, and a folder where a file belongs fails only when
the write's last step (the rename) runs, after the work. `os.stat` says which, and never blocks. Standard library
only: the command line and the data layouts both ask.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def kind_words(mode: int) -> str:
    """What an `st_mode` is, in words: "a regular file", "a folder", "a FIFO (named pipe)", ..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((words for test, words in KINDS if test(mode)), "not a regular file")


def not_a_file(path: Path) -> str | None:
    """What `path` is when it exists and is no regular file (symbolic links followed), in words; None for a
    regular file or no file at all (nothing in the way). A path that cannot be examined (a loop of links, a
    folder without search permission) is described by its error."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    return None if stat.S_ISREG(mode) else kind_words(mode)


class NotARegularFile(Exception):
    """A data file that exists but is no regular file; refused without opening it. Deliberately no OSError: the
    readers that treat an unreadable file as missing must not swallow it."""

    def __init__(self, path: Path, kind: str) -> None:
        super().__init__(f"{str(path)!r} is {kind}, not a regular file; raybench opens no FIFO, socket, device or "
                         f"folder where a data file belongs (replace it with the file itself)")
        self.path, self.kind = Path(path), kind


def regular_file(path: Path) -> bool:
    """Whether the regular file `path` exists: False when nothing is there; NotARegularFile when something else
    (a FIFO, a socket, a device, a folder) is."""
    kind = not_a_file(path)
    if kind is not None:
        raise NotARegularFile(path, kind)
    return os.path.exists(path)
