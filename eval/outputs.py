"""Where each rpg-eval command writes: the project's write policy (``rpg_openrlhf.common.writes``)
applied command by command (docs/eval.md, "What happens when").

Every file goes through an :class:`~rpg_openrlhf.common.writes.OutputDir`: no link followed below
the output directory (also one planted during the write), only regular files replaced, each file
replaced atomically. Which directory a command may write into (the policy's rule 3):

* ``table``, ``plot``, ``compare`` (``--out DIR``): a directory they claim, new, empty or marked
  ``.rpg-owner`` by the same command; :func:`check_claimable` says so before any work (nothing
  changes on a refusal), :func:`claim` marks it when the results are ready.
* ``summarize``: a run directory (its ``run.json`` is ``rpg-eval run``'s), or a directory it claims
  as above, which may also hold the records it summarizes (the inputs, or directories holding them:
  ``summarize eval/a eval/b --out eval``); :func:`summary_dir`.
* ``run``: its ``--out`` is owned through ``run.json`` and locked (``outdir.py``).
* ``score --out FILE``, ``report OUT``, ``table import-paper --out FILE``: one file the user names,
  absent or a regular file (``check_output_path`` before the work, ``write_file`` after).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from rpg_openrlhf.common.writes import OWNER_FILE, OutputDir, UnsafePathError, open_regular

#: The name each command marks its output directory with (the text of .rpg-owner).
TABLE, PLOT, COMPARE, SUMMARIZE = "rpg-eval table", "rpg-eval plot", "rpg-eval compare", "rpg-eval summarize"


@contextlib.contextmanager
def opened(out_dir: str | os.PathLike | OutputDir) -> Iterator[OutputDir]:
    """``out_dir`` as an open directory for a library function's writes: itself, or the path opened
    (created) for the block. Rule 3 is the command's: the directory is its caller's choice."""
    if isinstance(out_dir, OutputDir):
        yield out_dir
    else:
        with OutputDir.open(out_dir, create=True) as out:
            yield out


def read_input(path: str | os.PathLike, flag: str = "") -> bytes:
    """The bytes of an input file; a FIFO, device, socket or directory is refused (one line naming
    it) without blocking on it."""
    with open_regular(path, flag) as f:
        return f.read()


def _foreign(path: Path, command: str, flag: str, names: Sequence[str]) -> UnsafePathError:
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return UnsafePathError(
        f"{flag} {path}: holds {shown} and no {OWNER_FILE} naming {command}, so {command} did not write "
        "it; nothing was changed: give a new or empty directory"
    )


def _check_entries(out: OutputDir, names: Iterable[str] | None) -> None:
    """Each of ``names`` (None: every entry) absent or a regular file."""
    out.check_files(out.names() if names is None else names)


def check_claimable(
    path: str | os.PathLike,
    command: str,
    flag: str = "--out",
    names: Iterable[str] | None = None,
    allowed: frozenset[tuple[int, int]] = frozenset(),
) -> None:
    """Before any work, changing nothing: ``path`` may become ``command``'s output directory (absent,
    empty, marked by ``command``, or holding only the entries whose (device, inode) is in
    ``allowed``), and each of ``names`` in it (None: every entry) is absent or a regular file."""
    path = Path(path)
    try:
        out = OutputDir.open(path, flag=flag)  # a file at the path, or on the way to it: refused, named
    except FileNotFoundError:
        return  # made when the results are written
    with out:
        owner = out.owner()
        if owner != command:
            if owner is not None:
                raise UnsafePathError(
                    f"{flag} {path}: written by {owner} ({OWNER_FILE}), not by {command}; nothing was "
                    "changed: give a new or empty directory"
                )
            foreign = [n for n in out.names() if _identity(out, n) not in allowed]
            if foreign:
                raise _foreign(path, command, flag, foreign)
        _check_entries(out, names)


def _identity(out: OutputDir, name: str) -> tuple[int, int]:
    st = out.stat(name)
    return st.st_dev, st.st_ino


def claim(
    path: str | os.PathLike,
    command: str,
    flag: str = "--out",
    names: Iterable[str] | None = None,
    allowed: frozenset[tuple[int, int]] = frozenset(),
) -> OutputDir:
    """``command``'s output directory at ``path``, opened and marked (after :func:`check_claimable`,
    checked again now that the results are ready); ``names`` as there."""
    names = None if names is None else list(names)
    check_claimable(path, command, flag, names, allowed)
    out = OutputDir.open(path, create=True, flag=flag)
    try:
        if out.owner() != command:
            out.write_text(OWNER_FILE, command + "\n")
        _check_entries(out, names)
    except BaseException:
        out.close()
        raise
    return out


def identities(paths: Iterable[str | os.PathLike]) -> frozenset[tuple[int, int]]:
    """(device, inode) of each path and of the directory holding each file among them: what a
    directory summarized into may hold besides summarize's own files."""
    found = set()
    for p in map(Path, paths):
        for q in (p,) if p.is_dir() else (p, p.parent):
            try:
                st = os.stat(q)
            except OSError:
                continue
            found.add((st.st_dev, st.st_ino))
    return frozenset(found)


def _is_run_dir(path: Path) -> bool:
    from .outdir import is_run_dir

    return path.is_dir() and is_run_dir(path)


def check_summary_dir(path: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> None:
    """Before any work, changing nothing: ``rpg-eval summarize`` may write into ``path``: a run
    directory of ``rpg-eval run``, or a directory it may claim that may also hold the ``inputs`` (or
    the directories holding them)."""
    if not _is_run_dir(Path(path)):
        check_claimable(path, SUMMARIZE, names=SUMMARY_FILES, allowed=identities(inputs))


def summary_dir(path: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> OutputDir:
    """Where ``rpg-eval summarize`` writes (see :func:`check_summary_dir`): a run directory opened as
    it is (``rpg-eval run`` owns it), else the directory claimed and marked for summarize."""
    if _is_run_dir(Path(path)):
        return OutputDir.open(path)
    return claim(path, SUMMARIZE, names=SUMMARY_FILES, allowed=identities(inputs))


#: The files ``rpg-eval summarize`` writes (stats/summary.py).
SUMMARY_FILES = ("summary.csv", "last_best.csv", "disagreements.json")
