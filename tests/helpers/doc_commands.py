"""The shell commands of README.md and docs/*.md, as a user would copy them (tests/test_docs_commands.py).

A command is one logical line of a fenced ``bash`` / ``sh`` / ``shell`` block: continuation lines
(``\\``) joined, a trailing ``# comment`` dropped. Each keeps where it was written (file:line) so a
failure names the place to fix.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\w*)\s*$")
SHELL_LANGS = {"bash", "sh", "shell"}


@dataclass(frozen=True)
class DocCommand:
    file: str  # relative to the repository root
    line: int  # 1-based line of the command's first line
    text: str  # the command, continuation lines joined, comment dropped

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text, comments=False)

    @property
    def program(self) -> str:
        """The first word that is not a VAR=value assignment."""
        return next(w for w in self.words if not re.match(r"^[A-Z_][A-Z0-9_]*=", w))

    @property
    def flags(self) -> list[str]:
        """Every ``--flag`` written (``--flag=value`` as ``--flag``)."""
        return [w.split("=", 1)[0] for w in self.words if w.startswith("--") and len(w) > 2]


def _strip_comment(line: str) -> str:
    """A line without its trailing comment (a ``#`` outside quotes, at the start or after a space)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands_in(path: Path, root: Path) -> list[DocCommand]:
    """Every command of the shell blocks of ``path``."""
    found: list[DocCommand] = []
    lang: str | None = None
    pending: list[str] = []
    start = 0
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fence = FENCE.match(raw.strip())
        if fence:
            lang = None if lang is not None else fence.group(1)
            continue
        if lang not in SHELL_LANGS:
            continue
        line = _strip_comment(raw)
        if not pending:
            start = n
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line.strip())
        text = " ".join(p for p in pending if p)
        pending = []
        if text:
            found.append(DocCommand(path.relative_to(root).as_posix(), start, text))
    return found


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def all_commands(root: Path) -> list[DocCommand]:
    return [c for f in doc_files(root) for c in commands_in(f, root)]
