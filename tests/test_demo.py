"""The CPU demo (``rpg-demo``): its pieces (fast) and ``rpg-demo --quick`` end to end (e2e).

The e2e test runs the real thing: OpenRLHF's SFT trainer, two ``rpg-train`` runs on the CPU backend
(RPG-REINFORCE-URKL and GRPO), the evaluation, ``rpg-eval table`` and ``rpg-eval plot``. It checks
that the table and plots exist and are valid and that RL steps really happened; it does not assert
that the reward rises (four quick steps are too few to say so reliably).
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


def test_rl_steps_are_shown_while_the_stage_runs(tmp_path: Path, capsys) -> None:
    """make demo's RL stages print each step as it comes: the child waits for a file that only the
    progress printer's sight of step 1 creates, so a printer that runs at the end would time out."""
    seen = tmp_path / "seen"
    child = (
        "import os, sys, time\n"
        "print(\"(PPOTrainer) Global step 1: {'reward': 0.25}\", flush=True)\n"
        f"while not os.path.exists({str(seen)!r}): time.sleep(0.1)\n"
        "print(\"Global step 2: {'reward': 0.5}\", flush=True)\n"
    )
    printer = demo._step_printer(2)

    def on_line(line: str) -> None:
        printer(line)
        if "Global step 1" in line:
            seen.touch()

    out = demo.run_logged(
        [sys.executable, "-c", child], tmp_path / "x.log", dict(os.environ), 60, "child", on_line
    )
    assert "Global step 2" in out
    assert capsys.readouterr().out.splitlines() == [
        "[rpg-demo]           step 1/2: train reward 0.250",
        "[rpg-demo]           step 2/2: train reward 0.500",
    ]


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
    text = " ".join(rpg)
    assert "--rpg.loss urkl --rpg.style reinforce_clip --rpg.ref_update rollout" in text
    assert "--ckpt.save_hf" in rpg and "--logger.tensorboard_dir /o/tensorboard" in text
    assert rpg[rpg.index("--data.max_samples") + 1] == str(cfg.rl_steps * cfg.rl_prompts_per_step)
    grpo = " ".join(demo.rl_argv(cfg, "grpo", Path("/m"), Path("/p.jsonl"), Path("/o/work/grpo")))
    assert "--algo.advantage.estimator group_norm" in grpo and "--rpg.loss" not in grpo


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(budgets.starts(3) + 60)
def test_demo_quick(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rpg_openrlhf.demo", "--quick", "--out", str(out)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        text, _ = proc.communicate(timeout=budgets.starts(3))  # SFT, two RL runs, evals
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        pytest.fail(f"rpg-demo --quick timed out:\n{text[-6000:]}")
    assert proc.returncode == 0, text[-6000:]

    # Table: Markdown and CSV with one row per method, RPG's paired difference to GRPO, the held-out Best.
    table = (out / "table.md").read_text()
    assert "RPG-REINFORCE-URKL" in table and "GRPO" in table
    assert "RPG-REINFORCE-URKL (RPG-Style Clip) − GRPO, a+b held-out: Last " in table and "held-out" in table
    with open(out / "table.csv") as fh:
        rows = {r["run"]: r for r in csv.DictReader(fh)}
    assert len(rows) >= 2 and rows["rpg_reinforce_urkl"]["baseline"] == "grpo"
    lo, hi = (
        float(rows["rpg_reinforce_urkl"]["last_diff_ci_low"]),
        float(rows["rpg_reinforce_urkl"]["last_diff_ci_high"]),
    )
    assert lo <= float(rows["rpg_reinforce_urkl"]["last_diff"]) <= hi
    # The report: one offline page with the table, plots and every sample, and its screenshot
    page = (out / "report.html").read_text()
    assert (
        '<table class="results"' in page and page.count("data:image/png;base64,") >= 3 and "rpg-data" in page
    )
    assert (out / "report.png").read_bytes().startswith(PNG_MAGIC)

    # Plots: valid, non-empty PNGs (training curves and eval scores).
    for name in ("eval.png", "overlay_reward.png", "run_GRPO.png", "run_RPG-REINFORCE-URKL.png"):
        data = (out / "plots" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000, name

    # RL steps happened: step records, TensorBoard logs, checkpoints evaluated.
    cfg = demo.DemoConfig.quick()
    summary = json.loads((out / "summary.json").read_text())
    for run in demo.METHODS:
        steps = [json.loads(line) for line in (out / "runs" / run / "steps.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps] == list(range(1, cfg.rl_steps + 1)), run
        assert all(0.0 <= s["reward"] <= 1.0 for s in steps)
        assert list((out / "tensorboard" / run).rglob("events.out.tfevents*")), run
        assert summary["runs"][run]["reward"]["steps"] == cfg.rl_steps
    rpg_steps = (out / "runs" / "rpg_reinforce_urkl" / "steps.jsonl").read_text()  # RPG's own statistics
    assert "rpg/w_mean" in rpg_steps and "rpg/clip_frac_low" in rpg_steps
    with open(out / "eval" / "summary.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["grader"] == "math_verify"]
    steps_evaluated = {(r["run"], int(r["step"])) for r in rows}
    for run in demo.METHODS:
        assert (run, 0) in steps_evaluated and (run, cfg.rl_steps) in steps_evaluated
    assert all(int(r["n_problems"]) == cfg.heldout for r in rows)
    assert (out / "README.md").read_text().count("|") > 10
    assert (
        summary["comparison"]["baseline"] == "grpo"
        and "rpg_reinforce_urkl" in summary["comparison"]["methods"]
    )
    assert all("heldout_best" in summary["runs"][run]["eval"] for run in demo.METHODS)


def test_eval_goes_through_rpg_eval_run(tmp_path):
    """The eval step is ``rpg-eval run`` on a custom plain-prompt benchmark, and the checkpoint tree it
    is pointed at gives the SFT model step 0 and the RL checkpoints their steps."""
    from rpg_eval.run.checkpoints import find_checkpoints

    cfg = demo.DemoConfig.quick()
    argv = demo.eval_argv(cfg, "grpo", Path("/c"), Path("/h.jsonl"), Path("/o/eval/grpo"))
    text = " ".join(argv)
    assert argv[1:4] == ["-m", "rpg_eval.cli", "run"]
    assert "--benchmarks addition --data addition=/h.jsonl --prompt-style plain --allow-fallback" in text
    assert f"--n {cfg.eval_n} --max-tokens {cfg.max_new_tokens}" in text and "--run grpo" in text
    sft, rl = tmp_path / "sft", tmp_path / "run" / "ckpt" / "global_step2_hf"
    for d in (sft, rl):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    root = demo.eval_checkpoints(tmp_path / "eval_ckpts", sft, demo.checkpoints_of(tmp_path / "run"))
    assert [(c.name, c.step) for c in find_checkpoints(root)] == [
        ("global_step0_hf", 0),
        ("global_step2_hf", 2),
    ]


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
