"""scripts/run_config.sh on a config that is not one (issue 31): an empty or list yaml, an unknown
placeholder, an unknown name: one line ``run_config.sh: ...``, exit 2 (no traceback, no second
line), the unknown name with its closest matches rather than all 88 names."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_configs import _activated, _run_config


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "got empty"), ("[1, 2]\n", "got a list"), ("flags: 3\n", "no 'flags' mapping"),
     ("name: x\nflags: {data.prompt_dataset: '{dta}'}\n", "unknown or malformed placeholder ('dta')"),
     ("flags: [\n", "not readable as YAML")],
)  # fmt: skip
def test_a_bad_config_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    proc = _run_config(tmp_path, _activated(tmp_path), str(config))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("run_config.sh: ") and message in lines[0], lines


def test_an_unknown_name_gives_the_closest(tmp_path: Path) -> None:
    proc = _run_config(tmp_path, _activated(tmp_path), "rpg_urkl-qwen3_4b-8kk")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "closest: rpg_urkl-qwen3_4b-8k," in lines[0] and len(lines[0]) < 300, lines


@pytest.mark.parametrize(
    ("env", "message"),
    [("{PYTHONPATH: /tmp/site}", "env: PYTHONPATH is not a variable rpg-train reads"),
     ("{LD_PRELOAD: /tmp/x.so}", "env: LD_PRELOAD is not a variable rpg-train reads"),
     ("{RPG_MADE_UP: 1}", "env: RPG_MADE_UP is not a variable rpg-train reads"),
     ("{'A B': 1}", "env: 'A B' is not an environment variable name")],
)  # fmt: skip
def test_a_config_env_sets_only_the_projects_variables(tmp_path: Path, env: str, message: str) -> None:
    """Issue 38, item 12: a config's env: once exported everything (PYTHONPATH ran a sitecustomize.py);
    now only the RPG_* variables rpg-train reads, anything else named in one line before anything runs."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("open(__file__ + '.ran', 'w')\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"name: c\nenv: {env.replace('/tmp/site', str(site))}\nflags: {{rpg.loss: urkl}}\n")
    proc = _run_config(tmp_path, _activated(tmp_path), str(config), "--dry-run")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"run_config.sh: {config}: ") and message in lines[0], lines
    assert not (site / "sitecustomize.py.ran").exists()
