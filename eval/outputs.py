"""Where each rpg-eval command writes (docs/eval.md, "What happens when"), on ``common/atomic.py``.

``table``, ``plot``, ``compare`` claim their ``--out`` folder (new, empty or marked ``.rpg-owner`` by the
same command: :func:`check_claimable` before the work, :func:`claim` after); ``summarize`` writes into a
run folder or claims one, which may hold the records it reads; ``run`` owns its ``--out`` through
``run.json`` (outdir.py); ``score``, ``report``, ``table import-paper`` write one file."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from rpg_openrlhf.common.atomic import UnsafePathError, check_dir, kind, output_dir, write_file
from rpg_openrlhf.common.inputs import open_input

#: The name each command marks its output folder with (the text of .rpg-owner).
TABLE, PLOT, COMPARE, SUMMARIZE = "rpg-eval table", "rpg-eval plot", "rpg-eval compare", "rpg-eval summarize"
RUN_FORMAT, RUN_JSON = "rpg-eval run/2", "run.json"
#: The files ``rpg-eval summarize`` writes (stats/summary.py).
SUMMARY_FILES = ("summary.csv", "last_best.csv", "disagreements.json")


def check_files(folder: str | os.PathLike, names: Iterable[str]) -> None:
    """Each of ``names`` in ``folder`` absent or a regular file: refused before the first is written."""
    for name in names:
        if (what := kind(Path(folder) / name)) not in (None, "a regular file"):
            raise UnsafePathError(f"{Path(folder) / name}: is {what}; only a regular file is replaced")


def write_files(folder: str | os.PathLike, files: dict[str, str | bytes]) -> list[Path]:
    """Each of ``files`` (name -> text or bytes) into ``folder``, atomically, all checked first."""
    check_files(folder, files)
    for name, data in files.items():
        write_file(Path(folder) / name, data)
    return [Path(folder) / name for name in files]


def read_input(path: str | os.PathLike, flag: str = "") -> bytes:
    """The bytes of an input file; a FIFO, device or folder is refused (one line naming it)."""
    with open_input(path, flag) as f:
        return f.read()


def check_claimable(path: str | os.PathLike, command: str, flag: str = "--out", names: Iterable[str] | None = None,
                    allowed: Sequence[str | os.PathLike] = ()) -> None:  # fmt: skip
    """Before any work: ``path`` may become ``command``'s output folder (``check_dir``), and each of
    ``names`` in it (None: every entry) is absent or a regular file."""
    check_dir(path, command, flag, allowed=allowed)
    if Path(path).is_dir():
        check_files(path, os.listdir(path) if names is None else names)


@contextlib.contextmanager
def claim(path: str | os.PathLike, command: str, flag: str = "--out", names: Iterable[str] | None = None,
          allowed: Sequence[str | os.PathLike] = ()) -> Iterator[Path]:  # fmt: skip
    """``command``'s output folder at ``path`` (:func:`check_claimable`), made, locked and marked."""
    check_claimable(path, command, flag, names, allowed)
    with output_dir(path, command, flag, allowed=allowed) as p:
        yield p


def is_run_dir(d: Path) -> bool:
    """Whether ``d`` holds a run.json of ``rpg-eval run``."""
    try:
        with open_input(d / RUN_JSON) as f:
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # also no such file, d no folder
        return False
    return isinstance(data, dict) and data.get("format") == RUN_FORMAT


def check_summary_dir(path: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> None:
    """Before any work: ``rpg-eval summarize`` may write into ``path``: a run folder, or one it may
    claim that may also hold the ``inputs``."""
    if not is_run_dir(Path(path)):
        check_claimable(path, SUMMARIZE, names=SUMMARY_FILES, allowed=inputs)


@contextlib.contextmanager
def summary_dir(path: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> Iterator[Path]:
    """Where ``rpg-eval summarize`` writes (see :func:`check_summary_dir`)."""
    if is_run_dir(Path(path)):
        yield Path(path)
    else:
        with claim(path, SUMMARIZE, names=SUMMARY_FILES, allowed=inputs) as out:
            yield out


def run_inputs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """What a command reads from ``paths``: each path, and a run folder's records and run.json."""
    return [q for p in map(Path, paths) for q in (p, p / "samples.jsonl", p / "run.json")]
