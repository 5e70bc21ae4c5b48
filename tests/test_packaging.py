"""Every package in the tree ships: pyproject.toml lists each folder that holds an ``__init__.py``.

An editable install (what `make setup` does) finds a missing sub-package anyway; a wheel or a plain
``pip install .`` silently leaves it out (``rpg_openrlhf.demo`` was missing before this test).
"""

from __future__ import annotations

from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def _packages_in_tree() -> set[str]:
    found = set()
    for top, name in (("rpg_openrlhf", "rpg_openrlhf"), ("eval", "rpg_eval")):
        for init in (REPO / top).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / top).parts
            found.add(".".join((name, *rel)))
    return found


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert config["package-dir"] == {"rpg_eval": "eval"}
    assert _packages_in_tree() - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - _packages_in_tree() == set(), "listed in pyproject.toml but not in the tree"
