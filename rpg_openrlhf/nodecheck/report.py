"""One line per check: ``PASS  name  what was measured``; the lines also go to ``report.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import write_file


@dataclass
class Check:
    """The outcome of one check and what it measured."""

    name: str
    ok: bool
    detail: str
    values: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name:<16} {self.detail}"


def write(checks: list[Check], out: Path) -> None:
    """``report.json`` in ``out`` (the lines and their values), written atomically."""
    write_file(out / "report.json", json.dumps([asdict(c) for c in checks], indent=2, sort_keys=True) + "\n")
