"""The packages read as one mind wrote them: no function longer than a screen (60 lines), counted from
its ``def`` to its last line, docstring included (issue #17)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("rpg_openrlhf", "eval")
MAX_LINES = 60


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``file:line name (n lines)`` for every function of the tree under ``root`` longer than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_longer_than_a_screen(package: str) -> None:
    assert long_functions(REPO / package) == []


def test_the_count_sees_a_function_one_line_too_long(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))
    (tmp_path / "ok.py").write_text(f"def f():\n{body}\n")  # exactly MAX_LINES
    assert long_functions(tmp_path) == []
    nested = "\n".join("    " + line for line in body.splitlines())
    (tmp_path / "long.py").write_text(f"class C:\n    async def g(self):\n{nested}\n        y = 0\n")
    assert long_functions(tmp_path) == [f"long.py:2 g ({MAX_LINES + 1} lines)"]
