"""Every RPG setting is declared once (issue 27, item 2): the ``--rpg.*`` flag's default and help and
``LossConfig``'s default follow from one declaration; the rules are the core's; no sentinels, no
argparse internals, no import circle between the flags and the validation; one module says "is RPG on?".

Read from the source text (ast) and from a copy of the package with one declaration edited, never
from the objects under test alone."""

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
#: The flags that set a LossConfig field, and the field (docs/losses.md; written here, not imported).
LOSS_FLAGS = {
    "rpg.beta": "beta",
    "rpg.clip_c": "clip_c",
    "rpg.weight_level": "weight_level",
    "rpg.reward_term": "clip_reward",
    "rpg.kl_value_clamp": "kl_value_clamp",
    "rpg.kl_rho": "kl_rho",
    "rpg.aggregation_scope": "aggregation_scope",
}


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


def test_is_rpg_on_is_asked_in_one_module() -> None:
    """The flag that turns RPG on is written as a string in one module (common/args.py's rpg_enabled)."""
    assert [p.relative_to(PKG).as_posix() for p in _modules_writing("rpg.loss")] == ["common/args.py"]


def test_each_loss_setting_is_named_in_one_module() -> None:
    """A flag that sets a LossConfig field is written in its declaration only (no second default,
    fallback or rule elsewhere reads it by name)."""
    for flag in LOSS_FLAGS:
        where = _modules_writing(flag)
        assert len(where) == 1, (flag, where)


def test_no_sentinels_no_argparse_internals_in_the_settings() -> None:
    for rel in (
        "plugin/flags.py",
        "plugin/validation.py",
        "plugin/enable.py",
        "core/settings.py",
        "core/terms.py",
    ):
        text = (PKG / rel).read_text()
        for banned in ("_option_string_actions", "DefaultFloat", "DefaultStr", "._actions"):
            assert banned not in text, (rel, banned)


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports (inside functions too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_flags_and_validation_are_no_circle() -> None:
    assert "rpg_openrlhf.plugin.flags" in _imports(PKG / "plugin" / "validation.py")
    assert not any(
        m.startswith("rpg_openrlhf.plugin.validation") for m in _imports(PKG / "plugin" / "flags.py")
    )


def test_validation_states_no_loss_rule_and_runs_no_dummy_loss() -> None:
    """The clip bound, beta, the KL clamp and the correction's weight level are the core's rules."""
    text = (PKG / "plugin" / "validation.py").read_text()
    assert "compute_loss" not in text and "torch" not in text
    for flag in LOSS_FLAGS:
        assert f'"{flag}"' not in text, flag


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
