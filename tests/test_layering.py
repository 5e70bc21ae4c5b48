"""The rooms of the project and who may import whom, read from every import of every module.

Rooms (docs/contracts.md, "Rooms"): ``core`` imports torch only; ``common`` (the shared floor)
imports no other room; the CPU backend (``cpu_backend``) imports nothing of RPG or of the eval
package; ``extras`` import the shared floor only; the plug-in imports the core and the extras, never
the CPU backend; the launcher imports the plug-in and the backend; the eval package (``rpg_eval``)
imports none of the training rooms; the training side imports the eval package only for the reward's
grader (``plugin/reward.py`` -> ``rpg_eval.graders``); the shared floor imports one module of the core,
the log-prob math both backends' log-prob path and the sync check run (``core.logprobs``: pure
torch, nothing of RPG). Imports inside functions count, and so do
module paths written as strings outside docstrings (what Ray, vLLM or importlib import by name).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "rpg_openrlhf"

#: room -> the rooms it may import (itself always). "torch" is the only third-party package core may use.
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "common": set(),
    "cpu_backend": {"common"},
    "extras": {"common"},
    "plugin": {"core", "common", "extras"},
    "launch": {"core", "common", "extras", "plugin", "cpu_backend"},
    "mechanisms": {"core", "common"},
    "eval": {"common"},
    # the GPU node check (a command of its own): the launcher's backend facts, the tiny models; its probe
    # also runs the RPG losses (core) and, without flash-attn, OpenRLHF's models on its stand-ins (cpu_backend)
    "nodecheck": {"core", "common", "launch", "cpu_backend", "tools"},
    # the CPU demo (rpg-demo): runs rpg-train (launch) and rpg-eval (eval) as commands, builds a tiny model
    "demo": {"common", "cpu_backend", "launch", "tools", "eval"},
    # the commands at the top of the package (data, tiny models) may use every room
    "tools": {"core", "common", "extras", "plugin", "launch", "cpu_backend", "mechanisms", "eval", "demo"},
}
#: The one import of the eval package allowed on the training side: the reward's grader.
GRADER_IMPORT = ("plugin/reward.py", "rpg_eval.graders")
#: The core module the shared floor may import (the chunked log-prob math; pure torch, nothing of RPG).
SHARED_CORE_IMPORTS = {
    ("common/logprobs_path.py", "rpg_openrlhf.core.logprobs"),
    ("common/sync_check.py", "rpg_openrlhf.core.logprobs"),
}
#: The registry lists every package's declarations by name (strings, imported on demand).
REGISTRY_NAMES = "common/seam.py"
TRAINING_ROOMS = {"core", "common", "cpu_backend", "extras", "plugin", "launch"}
MODULE_PATH = re.compile(r"\b(rpg_openrlhf(?:\.\w+)+|rpg_eval(?:\.\w+)*)\b")


def room_of_file(path: Path) -> str:
    if path.is_relative_to(REPO / "eval"):
        return "eval"
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else "tools"


def room_of_module(name: str) -> str | None:
    """The room a module name belongs to; None for third-party and stdlib modules."""
    parts = name.split(".")
    if parts[0] == "rpg_eval":
        return "eval"
    if parts[0] != "rpg_openrlhf":
        return None
    if len(parts) == 1:
        return "tools"
    sub = parts[1]
    return sub if sub in MAY_IMPORT else "tools"


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def imports_of(path: Path) -> list[tuple[int, str, str]]:
    """(line, module name, how) for every import and every module path written in a string."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(REPO).parts  # eval/ is the package rpg_eval, sub-packages below it
    package = ".".join(("rpg_eval", *rel[1:-1]) if room_of_file(path) == "eval" else rel[:-1])
    docstrings = _docstring_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, "import") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the file's package
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from rpg_openrlhf import core`: the names may be submodules, which decide the room
            subs = [f"{base}.{a.name}" for a in node.names if _exists(f"{base}.{a.name}")]
            found += [(node.lineno, name, "import") for name in subs or [base]]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            for written in MODULE_PATH.findall(node.value):  # "pkg.module.attr": its longest module prefix
                parts = written.split(".")
                prefixes = [".".join(parts[:n]) for n in range(len(parts), 1, -1)]
                module = next((m for m in prefixes if _exists(m)), None)
                if module is not None:
                    found.append((node.lineno, module, "string"))
    return found


def _exists(name: str) -> bool:
    """Whether a dotted name is one of the project's modules or packages (not a logger name, say)."""
    parts = name.split(".")
    root = REPO / "eval" if parts[0] == "rpg_eval" else PKG if parts[0] == "rpg_openrlhf" else None
    if root is None:
        return False
    path = root.joinpath(*parts[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() or len(parts) == 1


def sources() -> list[Path]:
    files = sorted(PKG.rglob("*.py")) + sorted((REPO / "eval").rglob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts]


def violations(path: Path) -> list[str]:
    room = room_of_file(path)
    rel = path.relative_to(PKG if room != "eval" else REPO).as_posix()
    bad = []
    for line, name, how in imports_of(path):
        target = room_of_module(name)
        if (
            room == "core"
            and target is None
            and name.split(".")[0] not in sys.stdlib_module_names | {"torch"}
        ):
            bad.append(f"{rel}:{line}: core imports {name} (torch only)")
        if target is None or target == room:
            continue
        if how == "string" and rel == REGISTRY_NAMES:
            continue
        if (rel, name) == GRADER_IMPORT or (rel, name) in SHARED_CORE_IMPORTS:
            continue
        if target not in MAY_IMPORT[room]:
            bad.append(f"{rel}:{line}: {room} -> {target} ({how} {name})")
    return bad


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_module_imports_only_what_its_room_may(path: Path) -> None:
    assert violations(path) == []


def test_the_rules_can_fail(tmp_path: Path) -> None:
    """Each rule, broken on purpose in a copy, is reported (a check that cannot fail proves nothing)."""
    cases = {
        PKG / "cpu_backend" / "zz_probe.py": (
            "from rpg_openrlhf.plugin import flags\n",
            "cpu_backend -> plugin",
        ),
        PKG / "cpu_backend" / "zz_probe2.py": ('HOOK = "rpg_eval.graders.grade"\n', "cpu_backend -> eval"),
        PKG / "core" / "zz_probe.py": ("import numpy\n", "core imports numpy"),
        PKG / "plugin" / "zz_probe.py": (
            "def f():\n    from rpg_openrlhf.cpu_backend import driver\n",
            "plugin -> cpu_backend",
        ),
        PKG / "plugin" / "zz_probe3.py": ("from rpg_eval import records\n", "plugin -> eval"),
        PKG / "common" / "zz_probe.py": ("from rpg_openrlhf.core import k3\n", "common -> core"),
        REPO / "eval" / "zz_probe.py": ("from rpg_openrlhf.plugin import reward\n", "eval -> plugin"),
        REPO / "eval" / "zz_probe2.py": (
            "from .graders import grade\nfrom rpg_openrlhf.common import atomic\n",
            None,
        ),
    }
    for path, (code, expected) in cases.items():
        path.write_text(code)
        try:
            found = violations(path)
        finally:
            path.unlink()
        if expected is None:
            assert found == [], found
        else:
            assert any(expected in v for v in found), (path, found)


def test_the_training_side_uses_the_eval_package_for_the_grader_only() -> None:
    uses = sorted(
        (p.relative_to(PKG).as_posix(), name)
        for p in sources()
        if room_of_file(p) in TRAINING_ROOMS
        for _, name, how in imports_of(p)
        if room_of_module(name) == "eval"
        and not (how == "string" and p.relative_to(PKG).as_posix() == REGISTRY_NAMES)
    )
    assert uses == [GRADER_IMPORT]
