"""A registered loss is a choosable loss (issue #27, item 4): README's "adding a variant" example,
saved as a user module, is selected from ``rpg-train --dry-run`` with ``--rpg.loss_module``, and a
worker building the loss config imports the module too."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_rpg_flags import dry_run, dry_run_error

from rpg_openrlhf.core import LOSSES
from rpg_openrlhf.plugin import flags

README = Path(__file__).resolve().parents[1] / "README.md"
MODULE = "user_losses_for_test"
KEY = ("ufkl", "reinforce_tis")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """README's example variant as an importable module (on sys.path, as PYTHONPATH puts it)."""
    head = "**Adding a variant is one function and one registry line:**\n```python\n"
    code = README.read_text().split(head, 1)[1].split("```", 1)[0]
    (tmp_path / f"{MODULE}.py").write_text("import torch\n" + code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield MODULE
    sys.modules.pop(MODULE, None)
    LOSSES.pop(KEY, None)


def test_a_loss_registered_in_a_user_module_is_chosen_from_rpg_train(user_module, capsys):
    # the module flag after the loss flags: it is imported before any of them is read
    cfg = dry_run(
        ["--rpg.loss", "ufkl", "--rpg.style", "reinforce_tis", "--rpg.loss_module", user_module], capsys
    )
    assert (cfg["rpg"]["loss"], cfg["rpg"]["style"]) == KEY
    assert KEY in LOSSES


def test_without_the_module_the_style_is_not_a_choice(capsys):
    assert KEY not in LOSSES
    err = dry_run_error(["--rpg.loss", "ufkl", "--rpg.style", "reinforce_tis"], capsys)
    assert "--rpg.style" in err and "'reinforce_tis' is not registered" in err


def test_a_module_that_does_not_import_is_named(capsys):
    err = dry_run_error(["--rpg.loss", "ufkl", "--rpg.loss_module", "no_such_module_for_test"], capsys)
    assert "--rpg.loss_module 'no_such_module_for_test'" in err and "Traceback" not in err


def test_a_worker_building_the_loss_config_imports_the_module(user_module):
    """A Ray worker parses nothing: RPGPolicyLoss.from_args builds flags.loss_config(args)."""
    assert KEY not in LOSSES
    args = SimpleNamespace(
        **{"rpg.loss": "ufkl", "rpg.style": "reinforce_tis", "rpg.loss_module": user_module}
    )
    flags.loss_config(args)
    assert KEY in LOSSES
