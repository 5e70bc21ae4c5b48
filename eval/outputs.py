"""Where each rpg-eval command writes (docs/eval.md, "What happens when"), on the project's write
module ``rpg_openrlhf.common.atomic``: every file replaced atomically, one run per folder.

* ``table``, ``plot``, ``compare`` (``--out DIR``): a folder they claim: new, empty or marked
  ``.rpg-owner`` by the same command; :func:`check_claimable` says so before any work (nothing
  changes on a refusal), :func:`claim` makes, locks and marks it when the results are ready.
* ``summarize``: a run folder (its ``run.json`` is ``rpg-eval run``'s), or a folder it claims as
  above, which may also hold the records it summarizes (``summarize eval/a eval/b --out eval``).
* ``run``: its ``--out`` is owned through ``run.json`` and locked (``outdir.py``).
* ``score --out FILE``, ``report OUT``, ``table import-paper --out FILE``: one file the user names
  (``check_output_path`` before the work, ``write_file`` after); an input of the command is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from rpg_openrlhf.common.atomic import (
    UnsafePathError,
    atomic_write,
    check_dir,
    kind,
    output_dir,
)
from rpg_openrlhf.common.inputs import open_input

#: The name each command marks its output folder with (the text of .rpg-owner).
TABLE, PLOT, COMPARE, SUMMARIZE = "rpg-eval table", "rpg-eval plot", "rpg-eval compare", "rpg-eval summarize"


class OutputDir:
    """A folder a library function writes into: names joined to its path, each file atomic."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    @classmethod
    def open(cls, path: str | os.PathLike, create: bool = False) -> OutputDir:
        if create:
            Path(path).mkdir(parents=True, exist_ok=True)
        return cls(path)

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def shown(self, rel: str | os.PathLike = "") -> Path:
        return self.path / rel if rel else self.path

    def kind(self, rel: str | os.PathLike) -> str | None:
        return kind(self.path / rel)

    def subdir(self, rel: str, create: bool = False) -> OutputDir:
        return OutputDir.open(self.path / rel, create)

    def check_files(self, names: Iterable[str]) -> None:
        """Each of ``names`` absent or a regular file: refused before the first is written."""
        for name in names:
            if (what := self.kind(name)) not in (None, "a regular file"):
                raise UnsafePathError(f"{self.path / name}: is {what}; only a regular file is replaced")

    def write_bytes(self, rel: str | os.PathLike, data: bytes) -> None:
        (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(self.path / rel, "wb") as f:
            f.write(data)

    def write_text(self, rel: str | os.PathLike, text: str) -> None:
        (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(self.path / rel) as f:
            f.write(text)


@contextlib.contextmanager
def opened(out_dir: str | os.PathLike | OutputDir) -> Iterator[OutputDir]:
    """``out_dir`` for a library function's writes: itself, or the path (made)."""
    yield out_dir if isinstance(out_dir, OutputDir) else OutputDir.open(out_dir, create=True)


def read_input(path: str | os.PathLike, flag: str = "") -> bytes:
    """The bytes of an input file; a FIFO, device or folder is refused (one line naming it)."""
    with open_input(path, flag) as f:
        return f.read()


def check_claimable(
    path: str | os.PathLike,
    command: str,
    flag: str = "--out",
    names: Iterable[str] | None = None,
    allowed: Sequence[str | os.PathLike] = (),
) -> None:
    """Before any work, changing nothing: ``path`` may become ``command``'s output folder (absent,
    empty, marked by ``command``, or holding only ``allowed``: inputs, or the folders holding them),
    and each of ``names`` in it (None: every entry) is absent or a regular file."""
    path = Path(path)
    check_dir(path, command, flag, allowed=allowed)
    if path.is_dir():
        OutputDir(path).check_files(os.listdir(path) if names is None else names)


@contextlib.contextmanager
def claim(
    path: str | os.PathLike,
    command: str,
    flag: str = "--out",
    names: Iterable[str] | None = None,
    allowed: Sequence[str | os.PathLike] = (),
) -> Iterator[OutputDir]:
    """``command``'s output folder at ``path`` (checked again now), made, locked and marked."""
    names = None if names is None else list(names)
    check_claimable(path, command, flag, names, allowed)
    with output_dir(path, command, flag, allowed=allowed) as p:
        OutputDir(p).check_files(os.listdir(p) if names is None else names)
        yield OutputDir(p)


RUN_FORMAT = "rpg-eval run/2"
RUN_JSON = "run.json"
# Settings written by the previous format's run.json (flat).
_V1_KEYS = {"run", "n", "max_tokens", "temperature", "top_p", "seed", "prompt_style", "backend"}


def is_run_dir(d: Path) -> bool:
    """Whether ``d`` holds a run.json of ``rpg-eval run`` (of any format)."""
    meta = d / RUN_JSON
    if not meta.is_file():  # also False when d is no folder
        return False
    try:
        with open_input(meta) as f:
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and (data.get("format") == RUN_FORMAT or set(data) >= _V1_KEYS)


def check_summary_dir(path: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> None:
    """Before any work: ``rpg-eval summarize`` may write into ``path``: a run folder of ``rpg-eval
    run``, or a folder it may claim that may also hold the ``inputs`` (or the folders holding them)."""
    if not is_run_dir(Path(path)):
        check_claimable(path, SUMMARIZE, names=SUMMARY_FILES, allowed=inputs)


@contextlib.contextmanager
def summary_dir(path: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> Iterator[OutputDir]:
    """Where ``rpg-eval summarize`` writes (see :func:`check_summary_dir`)."""
    if is_run_dir(Path(path)):
        yield OutputDir(path)
    else:
        with claim(path, SUMMARIZE, names=SUMMARY_FILES, allowed=inputs) as out:
            yield out


def run_inputs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """What a command reads from ``paths``: each path, and a run folder's records and run.json (an
    output there would replace them: ``report RUN/samples.jsonl --runs RUN``)."""
    return [q for p in map(Path, paths) for q in (p, p / "samples.jsonl", p / "run.json")]


#: The files ``rpg-eval summarize`` writes (stats/summary.py).
SUMMARY_FILES = ("summary.csv", "last_best.csv", "disagreements.json")
