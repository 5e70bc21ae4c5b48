"""One line per check: ``PASS  name  what was measured``; the lines also go to ``report.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Check:
    """The outcome of one check and what it measured."""

    name: str
    ok: bool
    detail: str
    values: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name:<16} {self.detail}"


def write(checks: list[Check], out: Path) -> Path:
    """``report.json`` in ``out`` (the lines and their values)."""
    path = out / "report.json"
    path.write_text(json.dumps([asdict(c) for c in checks], indent=2, sort_keys=True) + "\n")
    return path


def read(out: Path) -> list[Check]:
    """The checks of an earlier ``report.json``."""
    return [Check(**c) for c in json.loads((out / "report.json").read_text())]
