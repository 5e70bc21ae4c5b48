"""Every RPG setting is declared once (issue 27, item 2): the ``--rpg.*`` flag's default and help and
``LossConfig``'s default follow from one declaration, proven on a copy of the package with that one
declaration edited (read back through the parser, --help and LossConfig, never from the objects
under test alone)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "rpg_openrlhf"


def _string_constants(path: Path) -> list[str]:
    """Every string literal of a module but its docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def _modules_writing(name: str, root: Path = PKG) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if name in _string_constants(p))


_PROBE = """
import argparse, json, sys
from types import SimpleNamespace
from rpg_openrlhf.core import LossConfig
from rpg_openrlhf.plugin import flags
parser = flags.add_rpg_arguments(argparse.ArgumentParser(prog="probe"))
print(json.dumps({
    "parser_default": parser.get_default("rpg.beta"),
    "config_default": LossConfig().beta,
    "resolved": flags.loss_config(SimpleNamespace()).beta,
    "help": " ".join(parser.format_help().split()),
}))
"""


def _probe(package_root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, cwd=package_root, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_edit_of_a_declaration_changes_the_flag_the_help_and_the_loss_config(tmp_path: Path) -> None:
    """Copy the package, edit --rpg.beta's default and help where the flag is declared, and see the
    parser's default, its --help, LossConfig's default and the flags' resolution all follow."""
    copy = tmp_path / "rpg_openrlhf"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (declared,) = _modules_writing("rpg.beta", copy)  # written once (see above)
    text = declared.read_text()
    at = text.index('"rpg.beta"')
    head, tail = text[:at], text[at:]
    tail = re.sub(r"1e-4", "0.125", tail, count=1)
    tail = tail.replace('"KL coefficient beta"', '"KL coefficient beta (edited once)"', 1)
    declared.write_text(head + tail)
    got = _probe(tmp_path)
    assert got["parser_default"] == got["config_default"] == got["resolved"] == 0.125, got
    assert "KL coefficient beta (edited once)" in got["help"], got["help"]
    original = _probe(REPO)
    assert original["parser_default"] == original["config_default"] == 1e-4  # the paper's beta
