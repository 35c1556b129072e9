"""What changed in a tree, written down by the processes that change it, for the one that copies it elsewhere.

Copying a signed tree to a bucket after every publish used to walk the
whole tree to find what changed: seconds at tens of thousands of projects,
every few seconds.  Instead every writer of the tree appends the names it
wrote (``+NAME``) or removed (``-NAME``) to a :class:`Journal`, and the copier
takes what was appended since it last looked (:meth:`Journal.take`).

Several processes write (gateway workers signing, fetching files,
collecting garbage) and several may copy (each worker's pusher, one at a
time under their own lock): appends and takes hold an ``flock`` on the
journal for the moment they touch it, each append is one ``write``, and
the position read up to is kept in a file beside it, so each line is taken
once by whichever copier comes first.  A take that has read everything
empties the journal once it passes ``limit`` bytes, so it never grows
without bound.  A copier that starts scans the tree once, and takes from
the journal after that.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

_LIMIT = 16 << 20
_MAX_TAKE = 64 << 20  # one take reads at most this much; the rest is taken next time


class Journal:
    """An append-only list of changed names in ``path``; see the module docstring."""

    def __init__(self, path: Path, limit: int = _LIMIT) -> None:
        self.path = Path(path)
        self.limit = limit
        self._cursor = self.path.with_name(self.path.name + ".taken")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)

    def wrote(self, names: Iterable[str]) -> None:
        """Record that ``names`` (relative to the tree) were written."""
        self._append("+", names)

    def removed(self, names: Iterable[str]) -> None:
        """Record that ``names`` were removed from the tree."""
        self._append("-", names)

    def _append(self, sign: str, names: Iterable[str]) -> None:
        data = "".join(f"{sign}{name}\n" for name in names if "\n" not in name).encode()
        if not data:
            return
        with self._locked() as fd:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]

    def skip(self) -> None:
        """Mark everything appended so far as taken (a copier that is about to scan the whole tree)."""
        with self._locked() as fd:
            self._write_cursor(os.fstat(fd).st_size)

    def take(self) -> tuple[list[str], list[str]]:
        """The names written and removed since the last take (by any process), each once, in order of appending."""
        with self._locked() as fd:
            size = os.fstat(fd).st_size
            start = self._read_cursor()
            if start > size:  # emptied by a take that read it all; what follows is new
                start = 0
            data = os.pread(fd, min(size - start, _MAX_TAKE), start)
            complete = data[: data.rfind(b"\n") + 1]
            end = start + len(complete)
            if end == size and size > self.limit:
                os.ftruncate(fd, 0)
                end = 0
            self._write_cursor(end)
        wrote: list[str] = []
        removed: list[str] = []
        for line in complete.decode(errors="replace").splitlines():
            if line[:1] == "+":
                wrote.append(line[1:])
            elif line[:1] == "-":
                removed.append(line[1:])
        return wrote, removed

    def _read_cursor(self) -> int:
        try:
            return int(self._cursor.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def _write_cursor(self, offset: int) -> None:
        tmp = self._cursor.with_name(f".{self._cursor.name}.{os.getpid()}.tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, self._cursor)
