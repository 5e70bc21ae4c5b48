"""The CPU demo (``rpg-demo``): its pieces (fast) and ``rpg-demo --quick`` end to end (e2e).

The e2e test runs the real thing: OpenRLHF's SFT trainer, two ``rpg-train`` runs on the CPU backend
(RPG-REINFORCE-URKL and GRPO), the evaluation, ``rpg-eval table``, ``plot`` and ``report``. It checks
that the table, plots and page exist and are valid, that RL steps really happened and were evaluated
with the SFT model as step 0; it does not assert that the reward rises (four quick steps are too few
to say so reliably).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import budgets
import pytest

from rpg_openrlhf.demo import cli as demo
from rpg_openrlhf.demo.reward import exact_answer, response_part, reward_func

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_problems_are_disjoint_and_deterministic():
    train, heldout = demo.make_problems(0, 40)
    assert len(train) + len(heldout) == 2500 and len(heldout) == 40
    assert not {r["input"] for r in train} & {r["input"] for r in heldout}
    assert demo.make_problems(0, 40) == (train, heldout)
    for r in heldout:
        a, b = r["input"].rstrip("=").split("+")
        assert int(r["label"]) == int(a) + int(b) and 0 <= int(a) <= 49 and 0 <= int(b) <= 49


def test_reward_is_exact_answer():
    assert exact_answer("57 ", "57") and exact_answer("57<eos>", "57")
    assert not exact_answer("5 7", "57") and not exact_answer("057", "57") and not exact_answer("", "57")
    assert response_part("<pad>12+45=57 <eos><pad>", "12+45=") == "57"
    out = reward_func(
        ["12+45=57 <eos>", "12+45=56 <eos>", "1+1=2"], ["12+45=", "12+45=", "1+1="], ["57", "57", "2"]
    )
    assert out["rewards"].tolist() == [1.0, 0.0, 1.0]
    assert out["scores"].tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="differ in length"):
        reward_func(["a"], [], [])


def test_parse_steps_and_reward_summary():
    log = (
        "noise\n(_Trainer pid=1) INFO ✨ Global step 1: {'reward': 0.25, 'kl': 0.0}\n"
        "(_Trainer pid=1) INFO ✨ Global step 2: {'reward': 0.5, 'kl': nan}\n"
        "Global step 3: {'reward': 0.75}\n"
    )
    steps = demo.parse_steps(log)
    assert [s["step"] for s in steps] == [1, 2, 3] and steps[1]["kl"] is None
    summary = demo.reward_summary(steps, window=1)
    assert summary["first"] == 0.25 and summary["last"] == 0.75 and summary["steps"] == 3


def test_rl_command_lines():
    cfg = demo.DemoConfig()
    rpg = demo.rl_argv(cfg, "rpg_reinforce_urkl", Path("/m"), Path("/p.jsonl"), Path("/o/work/rpg"))
    assert "--rpg.loss urkl --rpg.style reinforce_clip --rpg.ref_update rollout" in " ".join(rpg)
    assert rpg[rpg.index("--data.max_samples") + 1] == str(cfg.rl_steps * cfg.rl_prompts_per_step)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(budgets.starts(3) + 60)
def test_demo_quick(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.Popen([sys.executable, "-m", "rpg_openrlhf.demo", "--quick", "--out", str(out)], cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        text, _ = proc.communicate(timeout=budgets.starts(3))  # SFT, two RL runs, evals
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"rpg-demo --quick timed out:\n{proc.communicate()[0][-6000:]}")
    assert proc.returncode == 0, text[-6000:]
    cfg = demo.DemoConfig.quick()
    assert f"step {cfg.rl_steps}/{cfg.rl_steps}: train reward " in text  # the RL stages show their steps

    # Table: one row per method, RPG's paired difference to GRPO, the held-out Best.
    assert "RPG-REINFORCE-URKL (RPG-Style Clip) − GRPO, a+b held-out: Last " in (out / "table.md").read_text()
    with open(out / "table.csv") as fh:
        rows = {r["run"]: r for r in csv.DictReader(fh)}
    assert rows["rpg_reinforce_urkl"]["baseline"] == "grpo" and rows["grpo"]["heldout"]  # held-out Best
    # The report: one offline page with the table, plots and every sample, and its screenshot; the plots.
    page = (out / "report.html").read_text()
    assert (
        '<table class="results"' in page and page.count("data:image/png;base64,") >= 3 and "rpg-data" in page
    )
    assert (out / "report.png").read_bytes().startswith(PNG_MAGIC)
    for name in ("eval.png", "overlay_reward.png", "run_GRPO.png", "run_RPG-REINFORCE-URKL.png"):
        data = (out / "plots" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000, name

    # RL steps happened (RPG's own statistics in its run, none in GRPO's stock run) and were evaluated,
    # the SFT model as step 0.
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "eval" / "summary.csv") as fh:
        evaluated = [r for r in csv.DictReader(fh) if r["grader"] == "math_verify"]
    assert all(int(r["n_problems"]) == cfg.heldout for r in evaluated)
    for run in demo.METHODS:
        steps = [json.loads(line) for line in (out / "runs" / run / "steps.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps] == list(range(1, cfg.rl_steps + 1)), run
        assert all(0.0 <= s["reward"] <= 1.0 for s in steps)
        assert all(("rpg/w_mean" in s) == (run == "rpg_reinforce_urkl") for s in steps), run
        assert list((out / "tensorboard" / run).rglob("events.out.tfevents*")), run
        assert {0, cfg.rl_steps} <= {int(r["step"]) for r in evaluated if r["run"] == run}, run
        assert summary["runs"][run]["reward"]["steps"] == cfg.rl_steps
        assert "heldout_best" in summary["runs"][run]["eval"]
    assert (
        summary["comparison"]["baseline"] == "grpo"
        and "rpg_reinforce_urkl" in summary["comparison"]["methods"]
    )
    assert (out / "README.md").read_text().count("|") > 10


def test_make_demo_leaves_the_committed_results_alone():
    """`make demo` (the README's main job) writes to runs/demo, which git ignores, so a newcomer's tree
    stays clean; `make results` still regenerates the committed results/demo."""
    dry = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, timeout=60)
    demo_lines = [line for line in dry.stdout.splitlines() if "rpg-demo" in line]
    assert demo_lines and all(line.split()[-2:] == ["--out", "runs/demo"] for line in demo_lines), dry.stdout
    assert demo.build_parser().parse_args([]).out == "runs/demo"  # the console script's default too
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/demo/README.md"], cwd=REPO, timeout=60)
    assert ignored.returncode == 0, "runs/demo is not ignored by git"
    tracked = subprocess.run(
        ["git", "ls-files", "results/demo/README.md"], cwd=REPO, capture_output=True, text=True
    )
    assert tracked.stdout.strip() == "results/demo/README.md"  # the committed copy
    assert "rpg_openrlhf.demo --out results/demo" in (REPO / "scripts" / "make_results.sh").read_text()
