"""``rpg-demo``: the whole RPG story on a CPU in a few minutes (``make demo``).

One command builds a tiny model, teaches it two-number addition briefly, RL-trains it with
RPG-REINFORCE-URKL (RPG-Style Clip, pi_ref = pi_old) and with GRPO through ``rpg-train`` on the
CPU backend, evaluates the saved checkpoints on held-out problems and writes a Last/Best table,
training plots and a README into ``--out``::

    rpg-demo                             # full demo into runs/demo (ignored by git; make demo)
    rpg-demo --out results/demo          # regenerate the committed copy (make results)
    rpg-demo --quick --out /tmp/demo     # same code path, fewer steps (CI)

Stages (each a subprocess or a call into the project's own tools):

1. ``build_tiny_model``: a Qwen2-shaped model (hidden 128, 2 layers, ~300k parameters) with a
   17-symbol character tokenizer (digits, ``+``, ``=``, ``:``, space, pad/eos/unk), seed 0.
2. Supervised warm-up with OpenRLHF's own SFT trainer (``openrlhf.cli.train_sft``) in a plain
   process with the CPU backend's worker patches (:func:`sft_worker`): ``"a+b="`` -> ``"c"``,
   a, b in [0, 49]; stopped early (sampled accuracy around 0.3) so RL has room to show a rise.
3. ``rpg-train`` (OpenRLHF's ``train_ppo_ray`` + ``--rpg.*``) on the CPU backend twice:
   RPG-REINFORCE-URKL (``--rpg.loss urkl --rpg.style reinforce_clip --rpg.ref_update rollout``)
   and GRPO (``group_norm`` advantages, k3 KL loss to the initial model); binary exact-answer
   reward (:mod:`rpg_openrlhf.demo_reward`), Hugging Face checkpoints every few steps,
   TensorBoard logs.
4. ``rpg-eval run`` (lm-eval, hf backend) per method over the SFT model (as step 0) and every
   saved checkpoint, on held-out problems (disjoint from all training prompts) given as a custom
   benchmark (``--benchmarks addition --data addition=heldout.jsonl``, prompt style ``plain``:
   ``"a+b="`` verbatim, no chat template; ``--allow-fallback`` grades the bare-number answers),
   n samples each at temperature 1; then ``rpg-eval summarize`` over both methods' records.
5. ``rpg-eval table`` (a demo layout, ``paper_table: null``) and ``rpg-eval plot`` (TensorBoard
   curves + ``eval.png``), and ``README.md`` with the numbers.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCHMARK = "addition"
BENCHMARK_DISPLAY = "a+b held-out"
PROMPT_STYLE = "plain"

#: The two RL methods of the demo: run name -> (label, rpg-train flags).
METHODS: dict[str, tuple[str, list[str]]] = {
    "rpg_reinforce_urkl": (
        "RPG-REINFORCE-URKL (RPG-Style Clip)",
        [
            "--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.ref_update", "rollout",
            "--rpg.beta", "1e-4", "--rpg.advantage", "mean", "--algo.kl.init_coef", "0",
            "--actor.eps_clip_low_high", "0.2", "0.28",
        ],
    ),
    "grpo": (
        "GRPO",
        [
            "--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
            "--algo.kl.init_coef", "1e-4", "--actor.eps_clip_low_high", "0.2", "0.2",
        ],
    ),
}  # fmt: skip


@dataclass
class DemoConfig:
    """Sizes of one demo run (the full demo and ``--quick`` differ only here)."""

    seed: int = 0
    heldout: int = 40  # held-out problems (never seen in SFT or RL)
    eval_n: int = 8  # samples per held-out problem
    sft_epochs: int = 44  # x 9 steps of 256 samples (~400 steps)
    sft_batch: int = 256
    sft_lr: float = 3e-3
    sft_target: float = 0.3  # stop the warm-up at the first checkpoint with this sampled accuracy
    sft_probe: int = 200  # training prompts used to measure it
    rl_steps: int = 30
    rl_prompts_per_step: int = 64
    rl_samples_per_prompt: int = 8
    rl_train_batch: int = 256  # two optimizer steps per rollout (off-policy data for the clip)
    rl_lr: float = 2e-4
    save_steps: int = 10
    max_new_tokens: int = 5
    methods: list[str] = field(default_factory=lambda: list(METHODS))

    @classmethod
    def quick(cls) -> DemoConfig:
        """The CI variant: same code path, fewer steps and problems."""
        return cls(heldout=16, eval_n=2, sft_epochs=12, rl_steps=4, save_steps=2)


# ----------------------------------------------------------------------------- data
def make_problems(seed: int, heldout: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """All pairs a, b in [0, 49] shuffled with ``seed``: (training rows, held-out rows).

    Rows are ``{"id", "input": "a+b=", "output"/"label": "c"}``; the held-out rows are disjoint from
    the training rows (SFT and RL both draw only from the training rows).
    """
    pairs = [(a, b) for a in range(50) for b in range(50)]
    random.Random(seed).shuffle(pairs)
    rows = [
        {"id": f"{a}+{b}", "input": f"{a}+{b}=", "output": str(a + b), "label": str(a + b)} for a, b in pairs
    ]
    return rows[heldout:], rows[:heldout]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows as JSON lines (creating the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ----------------------------------------------------------------------------- processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the demo's subprocesses: offline, CPU, one math thread per process.

    One thread per process is much faster on a small shared CPU (OpenMP spinning across many
    processes on 2 cores costs 10-30x); a value the user set wins.
    """
    env = dict(os.environ)
    defaults = {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "DS_ACCELERATOR": "cpu",
        "DS_BUILD_OPS": "0",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "WANDB_MODE": "offline",
        "PYTHONUNBUFFERED": "1",
    }
    ext = REPO / ".venv" / "torch_extensions"
    if ext.is_dir():
        defaults["TORCH_EXTENSIONS_DIR"] = str(ext)
    for key, value in defaults.items():
        env.setdefault(key, value)
    env.pop("RAY_ADDRESS", None)  # every run starts (and stops) its own local Ray
    env.update(extra or {})
    return env


def run_logged(
    argv: list[str],
    log: Path,
    env: dict[str, str],
    timeout: float,
    what: str,
    on_line: Callable[[str], None] | None = None,
) -> str:
    """Run a subprocess in its own process group, tee its output to ``log``; returns the output.

    ``on_line`` sees every complete line as it is written (progress while the stage runs). On
    timeout or Ctrl-C the whole group (Ray's processes included) is killed. A non-zero exit is a
    RuntimeError quoting the end of the log.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = _wait_following(proc, log, time.time() + timeout, on_line)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            _kill_group(proc)
            raise RuntimeError(f"{what}: stopped (timeout {timeout:.0f}s or interrupt); log: {log}") from None
        finally:
            _kill_group(proc, only_leftovers=True)
    out = log.read_text(errors="replace")
    if rc != 0:
        raise RuntimeError(f"{what} failed (exit {rc}); log: {log}\n{out[-4000:]}")
    return out


def _wait_following(
    proc: subprocess.Popen, log: Path, deadline: float, on_line: Callable[[str], None] | None
) -> int:
    """Wait for ``proc``, handing each new complete line of ``log`` to ``on_line`` (every second)."""
    if on_line is None:
        return proc.wait(timeout=max(0.0, deadline - time.time()))
    offset, pending = 0, ""
    while True:
        rc = proc.poll()
        with log.open(errors="replace") as f:
            f.seek(offset)
            chunk = f.read()
            offset = f.tell()
        *lines, pending = (pending + chunk).split("\n")
        for line in lines:
            on_line(line)
        if rc is not None:
            return rc
        if time.time() > deadline:
            raise subprocess.TimeoutExpired(proc.args, 0)
        time.sleep(1.0)


def _kill_group(proc: subprocess.Popen, only_leftovers: bool = False) -> None:
    """Kill the process group of ``proc`` (its Ray workers too)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    if not only_leftovers:
        proc.wait()


# ----------------------------------------------------------------------------- SFT
def sft_worker() -> None:
    """OpenRLHF's ``train_sft`` in this (plain, single-rank) process with the CPU backend patches.

    Called as ``python -c "from rpg_openrlhf.demo import sft_worker; sft_worker()" <train_sft flags>``.
    ``worker_setup`` makes OpenRLHF's CUDA calls harmless exactly as in a Ray worker of
    ``rpg-train``. One change of *speed* only: OpenRLHF's SFTDataset keeps its columns as
    lazy ``datasets`` columns and re-reads them for every sample (90% of the step time on a tiny
    model); they are turned into Python lists after the dataset is built (same values).
    """
    import runpy

    from rpg_openrlhf.cpu_backend.worker import worker_setup

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    worker_setup()
    import openrlhf.datasets
    import openrlhf.datasets.sft_dataset as sft_dataset

    original_init = sft_dataset.SFTDataset.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.prompts, self.responses = list(self.prompts), list(self.responses)
        self.prompt_ids_lens = list(self.prompt_ids_lens)
        if self.response_ranges is not None:
            self.response_ranges = list(self.response_ranges)

    sft_dataset.SFTDataset.__init__ = __init__
    openrlhf.datasets.SFTDataset = sft_dataset.SFTDataset
    sys.argv = ["openrlhf.cli.train_sft", *sys.argv[1:]]
    runpy.run_module("openrlhf.cli.train_sft", run_name="__main__")


def sft_argv(cfg: DemoConfig, base: Path, data: Path, out: Path, save_steps: int) -> list[str]:
    """The train_sft flags of the warm-up (ZeRO-2 keeps fp32 master weights under bf16; with ZeRO-0
    OpenRLHF's bf16 run keeps bf16 master weights and the tiny model barely learns).

    A Hugging Face checkpoint is saved every ``save_steps`` steps into ``<out>/../sft_ckpt`` so that
    :func:`pick_warmup` can stop the warm-up where the sampled accuracy first reaches the target."""
    return [
        "--model.model_name_or_path", str(base), "--data.dataset", str(data),
        "--data.input_key", "input", "--data.output_key", "output", "--data.input_template", "{}",
        "--data.max_len", "16", "--train.batch_size", str(cfg.sft_batch),
        "--train.micro_batch_size", str(cfg.sft_batch), "--train.max_epochs", str(cfg.sft_epochs),
        "--train.seed", str(cfg.seed), "--adam.lr", str(cfg.sft_lr), "--lr_scheduler", "constant",
        "--lr_warmup_ratio", "0", "--max_norm", "0", "--ds.zero_stage", "2",
        "--ds.attn_implementation", "sdpa", "--ckpt.output_dir", str(out),
        "--logger.logging_steps", "1000000",
        "--ckpt.path", str(out.parent / "sft_ckpt"), "--ckpt.save_hf", "--ckpt.disable_ds",
        "--ckpt.save_steps", str(save_steps), "--ckpt.max_num", "1000",
    ]  # fmt: skip


def probe_accuracy(model_dir: Path, rows: list[dict[str, str]], cfg: DemoConfig) -> float:
    """Sampled (temperature 1) accuracy of one answer per training prompt in ``rows``."""
    from rpg_openrlhf.demo_reward import exact_answer

    samples = generate(model_dir, [r["input"] for r in rows], 1, cfg.max_new_tokens, cfg.seed)
    return _mean([float(exact_answer(s[0], r["label"])) for s, r in zip(samples, rows)])


def pick_warmup(ckpt_root: Path, probe: list[dict[str, str]], cfg: DemoConfig) -> tuple[Path, int, list]:
    """The earliest SFT checkpoint whose sampled accuracy on ``probe`` reaches ``cfg.sft_target``.

    Supervised learning of addition is abrupt on this model (sampled accuracy goes from 0.2 to
    0.8 within ~50 steps), and where the jump happens shifts a little with CPU numerics; picking the
    checkpoint by a measured accuracy keeps the RL start near the target on any machine. Only
    checkpoints from the second half of training are probed; without a hit the last one is used.
    Returns (checkpoint, step, [(step, accuracy), ...]).
    """
    ckpts = sorted(
        (int(m.group(1)), d)
        for d in ckpt_root.glob("global_step*_hf")
        if (m := re.fullmatch(r"global_step(\d+)_hf", d.name)) and (d / "config.json").is_file()
    )
    if not ckpts:
        raise RuntimeError(f"SFT saved no checkpoints under {ckpt_root}")
    last_step = ckpts[-1][0]
    probed = []
    for step, d in ckpts:
        if step < last_step // 2 and step != last_step:
            continue
        acc = probe_accuracy(d, probe, cfg)
        probed.append((step, acc))
        if acc >= cfg.sft_target:
            return d, step, probed
    return ckpts[-1][1], last_step, probed


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Put the base model's tokenizer files (left padding, as built) into a trained model dir.

    OpenRLHF's SFT saves its training tokenizer (right padding), which would make batched
    generation of prompts of different lengths wrong in plain ``transformers``.
    """
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)


# ----------------------------------------------------------------------------- RL
def rl_argv(cfg: DemoConfig, run: str, model: Path, prompts: Path, out: Path) -> list[str]:
    """``rpg-train`` command line of one RL run (CPU backend)."""
    return [
        sys.executable, "-m", "rpg_openrlhf.launch.cli", "--backend", "cpu",
        "--actor.model_name_or_path", str(model),
        "--reward.remote_url", str(REPO / "rpg_openrlhf" / "demo_reward.py"),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--data.max_samples", str(cfg.rl_steps * cfg.rl_prompts_per_step),
        "--rollout.n_samples_per_prompt", str(cfg.rl_samples_per_prompt),
        "--rollout.batch_size", str(cfg.rl_prompts_per_step),
        "--rollout.micro_batch_size", "128",
        "--train.batch_size", str(cfg.rl_train_batch), "--train.micro_batch_size", "128",
        "--rollout.max_new_tokens", str(cfg.max_new_tokens), "--data.max_len", "16",
        "--rollout.temperature", "1.0", "--rollout.top_p", "1.0",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--vllm.num_engines", "1", "--ds.zero_stage", "2", "--ds.attn_implementation", "sdpa",
        "--train.num_episodes", "1", "--train.seed", str(cfg.seed),
        "--actor.adam.lr", str(cfg.rl_lr), "--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0",
        "--ckpt.save_hf", "--ckpt.disable_ds", "--ckpt.save_steps", str(cfg.save_steps),
        "--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "final"),
        "--logger.tensorboard_dir", str(out.parent.parent / "tensorboard"), "--logger.wandb.run_name", run,
        *METHODS[run][1],
    ]  # fmt: skip


_STEP_RE = re.compile(r"Global step (\d+): (\{.*\})")


def _step_printer(total: int) -> Callable[[str], None]:
    """Prints ``step k/total: reward r`` for each of OpenRLHF's "Global step" lines as it comes."""

    def on_line(line: str) -> None:
        for step in parse_steps(line):
            reward = step.get("reward")
            shown = f"{reward:.3f}" if isinstance(reward, int | float) else "-"
            print(f"[rpg-demo]           step {step['step']}/{total}: train reward {shown}", flush=True)

    return on_line


def parse_steps(log_text: str) -> list[dict[str, Any]]:
    """The status dict OpenRLHF's trainer prints every global step, with ``step`` added."""
    steps: dict[int, dict[str, Any]] = {}
    for m in _STEP_RE.finditer(log_text):
        text = re.sub(r"\b(nan|inf)\b", "None", m.group(2))
        try:
            status = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            continue
        steps[int(m.group(1))] = {"step": int(m.group(1)), **status}
    return [steps[k] for k in sorted(steps)]


# ----------------------------------------------------------------------------- eval
def generate(model_dir: Path, prompts: list[str], n: int, max_new_tokens: int, seed: int) -> list[list[str]]:
    """``n`` samples (temperature 1, no top-k/top-p) per prompt, as decoded responses."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = [p for p in prompts for _ in range(n)]
    enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]


def eval_checkpoints(root: Path, sft: Path, rl_checkpoints: list[tuple[str, Path, int]]) -> Path:
    """``root`` holding the checkpoints ``rpg-eval run`` evaluates for one method: the SFT model as
    ``global_step0_hf`` (the RL start, step 0) and the method's ``global_step<N>_hf``.

    Hard links, not symlinks: the runner resolves checkpoint paths and reads the step from the
    resolved directory name, so a symlink to ``work/sft`` would lose its step; a hard-linked tree
    costs no copy and keeps the name (copied where hard links are not possible)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    for name, path in [("global_step0_hf", sft)] + [(n, p) for n, p, _ in rl_checkpoints]:
        shutil.copytree(path, root / name, copy_function=link)
    return root


def eval_argv(cfg: DemoConfig, run: str, ckpts: Path, data: Path, out: Path) -> list[str]:
    """``rpg-eval run`` over one method's checkpoints on the held-out benchmark (a custom benchmark
    ``addition`` given by file, prompt style ``plain``: the model input is ``"a+b="`` verbatim, no
    chat template; bare-number answers graded by math-verify's anchor-free fallback).  Sampling as in
    training: temperature 1, top-p 1, at most ``max_new_tokens`` tokens, EOS ends a response."""
    return [
        sys.executable, "-m", "rpg_eval.cli", "run", "--checkpoints", str(ckpts), "--out", str(out),
        "--run", run, "--benchmarks", BENCHMARK, "--data", f"{BENCHMARK}={data}",
        "--prompt-style", PROMPT_STYLE, "--allow-fallback", "--backend", "hf", "--device", "cpu",
        "--n", str(cfg.eval_n), "--max-tokens", str(cfg.max_new_tokens), "--temperature", "1.0",
        "--top-p", "1.0", "--seed", str(cfg.seed), "--chunk", str(cfg.heldout),
        # float32 as in training's CPU backend (the checkpoints are saved in bf16).
        "--model-arg", "dtype=float32", "--no-summary",
    ]  # fmt: skip


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV written by ``rpg-eval summarize``."""
    import csv

    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def checkpoints_of(run_dir: Path) -> list[tuple[str, Path, int]]:
    """(name, path, step) of the HF checkpoints ``global_step<N>_hf`` of a run, by step."""
    found = []
    for d in (run_dir / "ckpt").glob("global_step*_hf"):
        m = re.fullmatch(r"global_step(\d+)_hf", d.name)
        if m and (d / "config.json").is_file():
            found.append((d.name, d, int(m.group(1))))
    return sorted(found, key=lambda c: c[2])


# ----------------------------------------------------------------------------- outputs
LAYOUT = """\
# Demo layout for rpg-eval table: runs only (no paper rows).
benchmarks: {{{bench}: "{display}"}}
tables:
  demo:
    title: "CPU demo: tiny Qwen2 on held-out a+b (mean@{n}, Last / Best over checkpoints)"
    paper_table: null
    benchmarks: [{bench}]
    rank: all
    rows:
{rows}
"""


def write_layout(path: Path, runs: list[str], n: int) -> Path:
    """The table layout of the demo (one row per RL run)."""
    rows = "\n".join(f'      - {{run: {r}, label: "{METHODS[r][0]}"}}' for r in runs)
    path.write_text(LAYOUT.format(bench=BENCHMARK, display=BENCHMARK_DISPLAY, n=n, rows=rows))
    return path


def _short(arg: str, out: Path) -> str:
    """A command-line argument for the README: paths relative to the repo or the output dir."""
    if arg == sys.executable:
        return ".venv/bin/python"
    for root, prefix in ((out, "<out>"), (REPO, ".")):
        if arg.startswith(str(root) + "/") or "=" + str(root) + "/" in arg:
            return arg.replace(str(root), prefix)
    return arg


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def reward_summary(steps: list[dict[str, Any]], window: int = 5) -> dict[str, float]:
    """Training reward: first / last step and the mean of the first / last ``window`` steps."""
    rewards = [float(s["reward"]) for s in steps if isinstance(s.get("reward"), (int, float))]
    if not rewards:
        return {}
    w = max(1, min(window, len(rewards) // 2 or 1))
    return {
        "steps": len(rewards),
        "first": rewards[0],
        "last": rewards[-1],
        "first_mean": _mean(rewards[:w]),
        "last_mean": _mean(rewards[-w:]),
        "window": w,
    }


# `make demo` writes here (ignored by git, so a newcomer's tree stays clean); `make results`
# regenerates the committed copy in results/demo.
DEFAULT_OUT = "runs/demo"
COMMITTED_OUT = "results/demo"


def _make_command(out: Path) -> str:
    """How the README says this output was made (the make target when there is one)."""
    repo = Path(__file__).resolve().parents[1]
    for target, rel in (("make demo", DEFAULT_OUT), ("make results", COMMITTED_OUT)):
        if out.resolve() == (repo / rel).resolve():
            return f"{target}   # = .venv/bin/rpg-demo --out {rel}"
    return f".venv/bin/rpg-demo --out {out}"


def _readme_intro(cmd: str, result: dict[str, Any], cfg: DemoConfig, quick: bool) -> list[str]:
    return [
        "# RPG CPU demo" + (" (quick mode)" if quick else ""),
        "",
        "Generated by `rpg-demo` (`rpg_openrlhf/demo.py`); see `docs/demo.md`.",
        "",
        "```bash",
        cmd,
        "```",
        "",
        "A Qwen2-shaped model (hidden 128, 2 layers, ~300k parameters, 17-symbol character tokenizer) "
        f"is warmed up on `a+b=` -> `c` (a, b in [0, 49]) with OpenRLHF's SFT trainer "
        f"({cfg.sft_epochs} epochs of {2500 - cfg.heldout} problems, batch {cfg.sft_batch}), then trained "
        f"with RL through `rpg-train` on the CPU backend for {cfg.rl_steps} steps "
        f"({cfg.rl_prompts_per_step} prompts x {cfg.rl_samples_per_prompt} samples, reward 1 for the exact "
        f"answer else 0, lr {cfg.rl_lr}). Checkpoints (every {cfg.save_steps} steps) and the SFT model "
        f"(step 0) are evaluated with `rpg-eval run` (lm-eval, hf backend) on {cfg.heldout} held-out "
        f"problems (never trained on), {cfg.eval_n} samples each at temperature 1, then summarized with "
        "`rpg-eval summarize`. The held-out problems are a custom benchmark `addition` given by file, "
        "with the `plain` prompt style (the model input is `a+b=` verbatim, no chat template) and "
        "math-verify's anchor-free fallback for the bare-number answers (`--allow-fallback`); "
        "one command per method, e.g.:",
        "",
        "```bash",
        *(result.get("eval_commands") or [])[:1],
        "```",
        "",
    ]


def _readme_numbers(result: dict[str, Any], cfg: DemoConfig) -> list[str]:
    lines = [
        "## Numbers",
        "",
        f"SFT warm-up: checkpoint of step {result['sft_step']} (the first whose sampled accuracy on "
        f"{cfg.sft_probe} training prompts reached {cfg.sft_target}; probed: "
        + ", ".join(f"step {s} {a:.2f}" for s, a in result["sft_probe"])
        + f"); held-out sampled accuracy {result['sft_accuracy']:.3f} (eval step 0).",
        "",
        "| method | train reward, first {w} steps | train reward, last {w} steps | eval Last (step) | eval Best (step) |".format(
            w=next(iter(result["runs"].values()))["reward"].get("window", 1) if result["runs"] else 1
        ),
        "|---|---|---|---|---|",
    ]
    for run, info in result["runs"].items():
        r, lb = info["reward"], info.get("eval", {})
        lines.append(
            f"| {METHODS[run][0]} | {r.get('first_mean', float('nan')):.3f} | {r.get('last_mean', float('nan')):.3f} "
            f"| {lb.get('last', float('nan')):.3f} ({lb.get('last_step', '-')}) "
            f"| {lb.get('best', float('nan')):.3f} ({lb.get('best_step', '-')}) |"
        )
    return [
        *lines,
        "",
        "Eval numbers are mean@n with the eval package's math_verify grader (bare-number answers, "
        "anchor-free fallback); `eval/summary.csv` has every checkpoint with its 95% interval and "
        "both graders (the paper grader needs an `Answer:` line, so it scores these bare answers 0); "
        "`eval/<method>/samples.jsonl` has every sample.",
        "",
    ]


def _readme_files_and_timings(timings: dict[str, float]) -> list[str]:
    return [
        "## Files",
        "",
        "| file | what |",
        "|---|---|",
        "| `table.md`, `table.csv` | Last / Best table (`rpg-eval table`, demo layout `work/layout.yaml`) |",
        "| `plots/run_*.png`, `plots/overlay_*.png` | training curves from TensorBoard (`rpg-eval plot`) |",
        "| `plots/eval.png` | held-out accuracy against checkpoint step |",
        "| `eval/summary.csv`, `eval/last_best.csv` | `rpg-eval summarize` of both methods |",
        "| `eval/<method>/samples.jsonl`, `eval/<method>/tasks/` | `rpg-eval run` records and its lm-eval task |",
        "| `runs/<method>/steps.jsonl` | the trainer's status at every RL step (reward, KL, clip fractions, ...) |",
        "| `tensorboard/<method>/` | OpenRLHF's TensorBoard logs |",
        "| `logs/*.log` | full output of every stage |",
        "| `summary.json` | all numbers and timings of this page |",
        "",
        "## Timings (seconds, wall clock)",
        "",
        "| stage | s |",
        "|---|---|",
        *[f"| {k} | {v:.0f} |" for k, v in timings.items()],
        "",
    ]


def write_readme(out: Path, result: dict[str, Any], cfg: DemoConfig, quick: bool) -> Path:
    """results/demo/README.md: the command, what ran, the numbers and where the files are."""
    cmd = "rpg-demo --quick --out " + str(out) if quick else _make_command(out)
    lines = [
        *_readme_intro(cmd, result, cfg, quick),
        *_readme_numbers(result, cfg),
        *_readme_files_and_timings(result["timings"]),
    ]
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path


# ----------------------------------------------------------------------------- main
@dataclass
class _Stages:
    """Where a demo run writes (out, its work/ and logs/), the children's environment, and the
    wall time of each stage (printed as it starts, recorded as it ends)."""

    out: Path
    env: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)
    t_all: float = field(default_factory=time.time)

    @property
    def work(self) -> Path:
        return self.out / "work"

    @property
    def logs(self) -> Path:
        return self.out / "logs"

    @contextlib.contextmanager
    def stage(self, key: str, message: str | None) -> Iterator[None]:
        t = time.time()
        if message:
            print(f"[rpg-demo] {time.time() - self.t_all:6.0f}s  {message}", flush=True)
        yield
        self.timings[key] = time.time() - t


CLI = [sys.executable, "-m", "rpg_eval.cli"]


def run_demo(out: Path, cfg: DemoConfig, quick: bool = False) -> dict[str, Any]:
    """Run every stage; returns the numbers written to ``<out>/summary.json``."""
    out = out.resolve()
    for d in ("work", "logs", "eval", "plots", "runs", "tensorboard"):
        shutil.rmtree(out / d, ignore_errors=True)
    (out / "work").mkdir(parents=True, exist_ok=True)
    s = _Stages(out, child_env())
    base, train_rows, rl_rows = _model_and_data(s, cfg)
    sft, sft_step, probed = _sft_warmup(s, cfg, base, train_rows, rl_rows)
    runs = _rl_runs(s, cfg, sft)
    eval_commands, sft_accuracy = _evaluate(s, cfg, sft, runs)
    _table_and_plots(s, cfg)
    s.timings["total"] = time.time() - s.t_all
    result = {
        "quick": quick,
        "config": asdict(cfg),
        "sft_accuracy": sft_accuracy,
        "sft_step": sft_step,
        "sft_probe": probed,
        "eval_commands": [" ".join(_short(a, out) for a in argv) for argv in eval_commands],
        "runs": runs,
        "timings": s.timings,
    }
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    write_readme(out, result, cfg, quick)
    return result


def _model_and_data(s: _Stages, cfg: DemoConfig) -> tuple[Path, list[dict], list[dict]]:
    """1. The tiny model and the SFT / RL / held-out data (work/data/*.jsonl)."""
    from rpg_openrlhf.tinymodel import ARITHMETIC_ALPHABET, build_tiny_model

    work = s.work
    with s.stage("model + data", "building the tiny model and the data"):
        base = build_tiny_model(
            work / "base", alphabet=ARITHMETIC_ALPHABET, hidden=128, layers=2, heads=4, kv_heads=2,
            intermediate=256, seed=cfg.seed, chat_template=False,
        )  # fmt: skip
        train_rows, heldout = make_problems(cfg.seed, cfg.heldout)
        write_jsonl(
            work / "data" / "sft.jsonl", [{"input": r["input"], "output": r["output"]} for r in train_rows]
        )
        rl_rows = list(train_rows)
        random.Random(cfg.seed + 1).shuffle(rl_rows)
        write_jsonl(work / "data" / "rl.jsonl", [{"input": r["input"], "label": r["label"]} for r in rl_rows])
        write_jsonl(
            work / "data" / "heldout.jsonl",
            [{"id": r["id"], "problem": r["input"], "answer": r["label"]} for r in heldout],
        )
    return base, train_rows, rl_rows


def _sft_warmup(
    s: _Stages, cfg: DemoConfig, base: Path, train_rows: list[dict], rl_rows: list[dict]
) -> tuple[Path, int, Any]:
    """2. SFT warm-up with OpenRLHF's SFT trainer, then the first checkpoint that reaches the target."""
    work = s.work
    with s.stage("SFT", f"SFT warm-up with OpenRLHF's train_sft ({cfg.sft_epochs} epochs)"):
        sft_final = work / "sft_final"
        steps_per_epoch = max(1, len(train_rows) // cfg.sft_batch)
        run_logged(
            [sys.executable, "-c", "from rpg_openrlhf.demo import sft_worker; sft_worker()",
             *sft_argv(cfg, base, work / "data" / "sft.jsonl", sft_final, save_steps=steps_per_epoch)],
            s.logs / "sft.log", s.env, timeout=1800, what="SFT (openrlhf.cli.train_sft)",
        )  # fmt: skip
    pick = f"picking the warm-up checkpoint (first with sampled accuracy >= {cfg.sft_target})"
    with s.stage("SFT checkpoint pick", pick):
        picked, sft_step, probed = pick_warmup(work / "sft_ckpt", rl_rows[: cfg.sft_probe], cfg)
        sft = work / "sft"
        shutil.copytree(picked, sft)
        copy_tokenizer(base, sft)
        shutil.rmtree(work / "sft_ckpt", ignore_errors=True)
        shutil.rmtree(sft_final, ignore_errors=True)  # the model after all epochs: not used
        print(f"[rpg-demo] warm-up: SFT step {sft_step} (probe accuracy by step: {probed})", flush=True)
    return sft, sft_step, probed


def _rl_runs(s: _Stages, cfg: DemoConfig, sft: Path) -> dict[str, dict[str, Any]]:
    """3. One rpg-train run per method; its training steps to runs/<method>/steps.jsonl."""
    runs: dict[str, dict[str, Any]] = {}
    for run in cfg.methods:
        with s.stage(f"RL {run}", f"RL: {METHODS[run][0]} via rpg-train, {cfg.rl_steps} steps"):
            run_dir = s.work / run
            text = run_logged(
                rl_argv(cfg, run, sft, s.work / "data" / "rl.jsonl", run_dir),
                s.logs / f"{run}.log",
                s.env,
                timeout=1800,
                what=f"rpg-train {run}",
                on_line=_step_printer(cfg.rl_steps),
            )
            steps = parse_steps(text)
            if not steps:
                raise RuntimeError(f"rpg-train {run}: no 'Global step' lines in {s.logs / f'{run}.log'}")
            write_jsonl(s.out / "runs" / run / "steps.jsonl", steps)
            runs[run] = {
                "reward": reward_summary(steps),
                "checkpoints": [c[0] for c in checkpoints_of(run_dir)],
            }
    return runs


def _evaluate(
    s: _Stages, cfg: DemoConfig, sft: Path, runs: dict[str, dict[str, Any]]
) -> tuple[list[list[str]], float]:
    """4. rpg-eval run per method (SFT model = step 0), then rpg-eval summarize; Last/Best into runs.
    Returns the eval command lines and the SFT model's held-out accuracy."""
    message = f"rpg-eval run: checkpoints on {cfg.heldout} held-out problems x {cfg.eval_n} samples"
    with s.stage("eval", message):
        eval_dir = s.out / "eval"
        eval_dir.mkdir(parents=True, exist_ok=True)
        eval_commands = []
        for run in cfg.methods:
            ckpts = eval_checkpoints(s.work / "eval_ckpts" / run, sft, checkpoints_of(s.work / run))
            argv = eval_argv(cfg, run, ckpts, s.work / "data" / "heldout.jsonl", eval_dir / run)
            eval_commands.append(argv)
            run_logged(argv, s.logs / f"eval_{run}.log", s.env, timeout=1800, what=f"rpg-eval run ({run})")
        run_logged(
            [*CLI, "summarize", *[str(eval_dir / r / "samples.jsonl") for r in cfg.methods],
             "--out", str(eval_dir), "--grader", "math_verify", "--seed", str(cfg.seed)],
            s.logs / "eval_summarize.log", s.env, timeout=600, what="rpg-eval summarize",
        )  # fmt: skip
        for row in read_csv(eval_dir / "last_best.csv"):
            if row["grader"] == "math_verify" and row["run"] in runs:
                runs[row["run"]]["eval"] = {
                    "last": float(row["last"]), "last_step": int(row["last_step"]),
                    "best": float(row["best"]), "best_step": int(row["best_step"]),
                }  # fmt: skip
        # Step 0 is the same SFT model in every method's run (same seed, same samples): take the first.
        step0 = [
            r for r in read_csv(eval_dir / "summary.csv")
            if r["grader"] == "math_verify" and int(r["step"]) == 0 and r["run"] == cfg.methods[0]
        ]  # fmt: skip
        sft_accuracy = float(step0[0]["mean"]) if step0 else float("nan")
    return eval_commands, sft_accuracy


def _table_and_plots(s: _Stages, cfg: DemoConfig) -> None:
    """5. The Last/Best table (table.md, table.csv) and the training plots, by rpg-eval."""
    out, eval_dir = s.out, s.out / "eval"
    with s.stage("table + plots", "table and plots"):
        layout = write_layout(s.work / "layout.yaml", cfg.methods, cfg.eval_n)
        run_logged(
            [*CLI, "table", "--layout", str(layout), "--table", "demo", "--runs", str(eval_dir / "last_best.csv"),
             "--grader", "math_verify", "--formats", "md,csv", "--out", str(s.work / "table")],
            s.logs / "table.log", s.env, timeout=300, what="rpg-eval table",
        )  # fmt: skip
        for fmt in ("md", "csv"):
            made = s.work / "table" / f"demo.{fmt}"
            if made.exists():
                shutil.copy2(made, out / f"table.{fmt}")
        tb = [f"{METHODS[r][0].split(' ')[0]}={out / 'tensorboard' / r}" for r in cfg.methods]
        labels = [f"--label={r}={METHODS[r][0].split(' ')[0]}" for r in cfg.methods]
        run_logged(
            [*CLI, "plot", "--tb", *tb, "--summary", str(eval_dir / "summary.csv"), *labels,
             "--grader", "math_verify", "--smooth", "0.6", "--formats", "png", "--out", str(out / "plots")],
            s.logs / "plot.log", s.env, timeout=300, what="rpg-eval plot",
        )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """rpg-demo's command line."""
    from rpg_openrlhf.common.cliutil import int_at_least

    parser = argparse.ArgumentParser(prog="rpg-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"output folder (default: {DEFAULT_OUT}, ignored by git; {COMMITTED_OUT} is the committed copy)",
    )
    parser.add_argument("--quick", action="store_true", help="same code path, fewer steps and problems (CI)")
    parser.add_argument(
        "--rl-steps", type=int_at_least(1), default=None, help="RL steps per method (override)"
    )
    parser.add_argument("--methods", default=None, help=f"comma list of {','.join(METHODS)} (default: both)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``rpg-demo``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    cfg = DemoConfig.quick() if args.quick else DemoConfig()
    if args.rl_steps:
        cfg.rl_steps = args.rl_steps
    if args.methods:
        cfg.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in cfg.methods if m not in METHODS]
        if unknown:
            parser.error(f"--methods: unknown {unknown}; choose from {list(METHODS)}")
    out = Path(args.out)
    try:
        result = run_demo(out, cfg, quick=args.quick)
    except RuntimeError as e:
        print(f"rpg-demo: error: {e}", file=sys.stderr)
        return 1
    out = out.resolve()
    print(f"\n[rpg-demo] done in {result['timings']['total']:.0f}s")
    print(f"  SFT warm-up: step {result['sft_step']}, held-out sampled accuracy {result['sft_accuracy']:.3f}")
    for run, info in result["runs"].items():
        r, e = info["reward"], info.get("eval", {})
        print(
            f"  {METHODS[run][0]}: train reward {r.get('first_mean', float('nan')):.3f} -> "
            f"{r.get('last_mean', float('nan')):.3f} (mean of first/last {r.get('window')} steps); "
            f"eval Last {e.get('last', float('nan')):.3f} (step {e.get('last_step')}), "
            f"Best {e.get('best', float('nan')):.3f} (step {e.get('best_step')})"
        )
    print(f"  table:  {out / 'table.md'}")
    print(f"  plots:  {out / 'plots'}")
    print(f"  README: {out / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
