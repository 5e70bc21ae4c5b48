"""rpg-train answers ``--help``, a usage error and ``--dry-run`` without importing Ray, DeepSpeed,
vLLM or OpenRLHF's trainer (issue #40 item 2), with OpenRLHF's parser exactly as its module builds it
when run as installed (``python -m openrlhf.cli.train_ppo_ray``)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_rpg_flags import BASE  # a config-only model directory and a real reward file

HELPERS = Path(__file__).resolve().parent / "helpers"


def _python(code_or_script: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *code_or_script], capture_output=True, text=True, timeout=timeout, check=False
    )


def _capture(way: str) -> dict:
    proc = _python([str(HELPERS / "train_parser_capture.py"), way])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def installed() -> dict:
    """OpenRLHF's parser from its module run as installed (every module-level import: ~10 CPU-s)."""
    return _capture("installed")


def test_the_parser_built_without_the_imports_is_openrlhfs(installed: dict) -> None:
    deferred = _capture("deferred")
    assert deferred["heavy"] == []  # nothing of Ray, DeepSpeed, vLLM or the trainer was imported
    assert installed["heavy"]  # ... which the installed way does: the check can see them
    assert len(installed["options"]) > 150
    # the one clock-read default, marked by the helper in both ways (a minute boundary between them)
    assert installed["defaults"]["logger.wandb.run_name"] == repr("ppo_<%m%dT%H:%M>")
    for key in ("options", "defaults", "help"):  # every flag, its default, its help text and choices
        assert deferred[key] == installed[key], key


def _flags_rpg_train_adds() -> list[str]:
    from rpg_openrlhf.launch.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return sorted(s for action in parser._actions for s in action.option_strings if s not in ("-h", "--help"))


#: rpg-train argv -> what the tests below read; all run in one fresh process, in this order, listing
#: after each the modules that must not be loaded (Ray, DeepSpeed, vLLM, OpenRLHF's trainer package;
#: one a call imported stays listed for the rest)
RPG_TRAIN = """
import contextlib, io, json, sys
from rpg_openrlhf.launch.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("ray", "deepspeed", "vllm")
                   or m.startswith("openrlhf.trainer"))
    results.append({"rc": code, "out": out.getvalue(), "err": err.getvalue(), "heavy": heavy})
print("\\nRESULTS " + json.dumps(results))
"""
ARGVS = {
    "help": ["--help"],
    "typo": [*BASE, "--rpg.los", "fkl"],
    "dry": [*BASE, "--rpg.loss", "urkl", "--dry-run"],
    "invalid": [*BASE, "--rpg.loss", "urkl", "--rpg.beta", "-1", "--dry-run"],
}


@pytest.fixture(scope="module")
def rpg_train() -> dict[str, dict]:
    proc = _python(["-c", RPG_TRAIN, json.dumps(list(ARGVS.values()))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(ARGVS, json.loads(proc.stdout.rsplit("\nRESULTS ", 1)[1])))


def test_help_lists_every_openrlhf_and_rpg_train_flag(installed: dict, rpg_train: dict) -> None:
    done = rpg_train["help"]
    assert done["rc"] == 0 and done["out"].startswith("usage: rpg-train"), done["err"][-2000:]
    assert done["heavy"] == []
    added = _flags_rpg_train_adds()
    assert any(s.startswith("--rpg.") for s in added) and "--dry-run" in added
    missing = [
        s for s in [*installed["options"], *added] if not re.search(re.escape(s) + r"(?![\w.-])", done["out"])
    ]
    assert missing == []


def test_a_usage_error_and_a_dry_run_answer_without_the_trainers_imports(rpg_train: dict) -> None:
    done = rpg_train["typo"]
    assert done["rc"] == 2 and done["heavy"] == []
    assert done["err"].strip().splitlines()[-1] == "rpg-train: error: unrecognized arguments: --rpg.los fkl"
    done = rpg_train["dry"]
    assert done["rc"] == 0 and done["heavy"] == [], done["err"][-2000:]
    config = json.loads(done["out"][done["out"].index("\n{") + 1 :])
    assert config["rpg"]["loss"] == "urkl" and config["backend"] == "cpu"
    # an invalid combination is still found there (validation ran), as one line
    done = rpg_train["invalid"]
    assert done["rc"] == 2 and done["heavy"] == [] and "--rpg.beta" in done["err"].strip().splitlines()[-1]
