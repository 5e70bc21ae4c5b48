"""Benchmark 2: what `--rpg.ref_update rollout` (no reference model) saves per training step.

Two rpg-train runs on the CPU pipeline (docs/training.md's command line, same tiny model,
same prompts, batch and seed), alternated --repeats times:
  rollout   --rpg.loss urkl --rpg.style reinforce_clip --rpg.ref_update rollout
            (pi_ref = pi_old: the old log-probs OpenRLHF already computes are the reference)
  initial   the same with --rpg.ref_update initial: OpenRLHF's usual reference model actor
            (one more model in memory, one reference forward per experience micro-batch)
Optionally (--with-stock) OpenRLHF's own GRPO-style run with its KL loss and reference model
(--algo.kl.use_loss --algo.kl.init_coef 1e-3, k3).

Per run: OpenRLHF's own step timings from its "Global step N: {...}" log lines
(timing/make_experience, timing/step_total; step 1 includes warm-up, so steps >= 2 are
compared), the peak memory of the whole process tree (sum of PSS over the driver, Ray and
every actor process, polled every 0.5 s), and the number of reference forwards: one per
experience micro-batch per global step (rollout.batch_size x n_samples / rollout.micro_batch_size).

    .venv/bin/python bench/reference_cost.py                     # ~6 min on 2 busy cores
    .venv/bin/python bench/reference_cost.py --hidden 256 --layers 4 --repeats 2
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import REPO, environment, fmt_table, median, write_json

PROMPTS = [(f"{i}+{j}=", str(i + j)) for i, j in zip(range(1, 9), (2, 4, 5, 0, 3, 1, 2, 6)) for _ in (0, 1)]


def base_argv(model: Path, prompts: Path, out: Path, a: argparse.Namespace) -> list[str]:
    """docs/training.md's CPU command line (2 global steps), sizes from the options."""
    return [
        sys.executable, "-m", "rpg_openrlhf.launch.cli", "--backend", "cpu",
        "--actor.model_name_or_path", str(model),
        "--reward.remote_url", str(REPO / "tests" / "helpers" / "reward_has_digit.py"),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--rollout.n_samples_per_prompt", str(a.n_samples),
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--rollout.batch_size", str(a.rollout_batch), "--train.batch_size", str(a.rollout_batch * a.n_samples),
        "--rollout.micro_batch_size", str(a.micro_batch), "--train.micro_batch_size", str(a.micro_batch),
        "--rollout.max_new_tokens", str(a.max_new_tokens),
        "--data.max_len", str(a.max_new_tokens + getattr(a, "prompt_pad", 0) + 32),
        "--ds.zero_stage", "0", "--vllm.num_engines", "1",
        "--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "final"),
        "--train.num_episodes", str(getattr(a, "episodes", 1)), "--actor.adam.lr", "1e-4", "--actor.lr_scheduler", "constant",
        "--train.seed", "42",
    ]  # fmt: skip


VARIANTS: dict[str, list[str]] = {
    "rollout": ["--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.ref_update", "rollout"],
    "initial": ["--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.ref_update", "initial"],
    "stock-kl": ["--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss", "--algo.kl.init_coef", "0.001",
                 "--algo.kl.estimator", "k3"],
}  # fmt: skip


def tree_pss_bytes(pid: int, seen: dict[int, float]) -> int:
    """Sum of PSS over a process and its descendants (shared pages counted once overall);
    records their pid -> create time in `seen` (to be killed at the end)."""
    import psutil

    total = 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            seen.setdefault(p.pid, p.create_time())
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_full_info().pss
    return total


def kill_seen(seen: dict[int, float], driver: int) -> None:
    """SIGKILL the processes of this run that outlived it (same pid *and* create time only)."""
    import psutil

    for pid, created in seen.items():
        if pid == driver:
            continue
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p = psutil.Process(pid)
            if p.create_time() == created:
                p.kill()


def run_one(argv: list[str], env: dict[str, str], timeout: int) -> dict[str, Any]:
    """Run rpg-train in its own session; parse step logs; track peak tree PSS."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    peak = [0]
    seen: dict[int, float] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_pss_bytes(proc.pid, seen))
            stop.wait(0.5)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = ""
    finally:
        stop.set()
        th.join()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # Ray's processes live in this session
        kill_seen(seen, proc.pid)
        proc.wait()
    steps = {}
    for m in re.finditer(r"Global step (\d+): (\{.*\})", out):
        text = re.sub(r"\b(nan|inf)\b", "None", m.group(2))
        steps[int(m.group(1))] = ast.literal_eval(text)
    return {"rc": proc.returncode, "wall_s": time.perf_counter() - t0, "peak_pss_bytes": peak[0],
            "steps": steps, "tail": out[-3000:] if not steps or proc.returncode else ""}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Alternate the variants, print per-step experience-making time and memory ratios."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2, help="alternating rounds of the variants")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--n-samples", type=int, default=4)
    p.add_argument("--rollout-batch", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--with-stock", action="store_true", help="also OpenRLHF's GRPO + k3 KL loss run")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    from rpg_openrlhf.tinymodel import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="rpg_ref_cost_"))
    model = build_tiny_model(
        tmp / "model", hidden=a.hidden, layers=a.layers, intermediate=4 * a.hidden, seed=0
    )
    n_params = sum(f.stat().st_size for f in Path(model).glob("*.safetensors")) // 4  # fp32
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": q, "label": ans}) + "\n" for q, ans in PROMPTS))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
           "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"}  # fmt: skip
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    names = ["rollout", "initial"] + (["stock-kl"] if a.with_stock else [])
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(a.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            out = tmp / f"{name}_{r}"
            res = run_one(base_argv(model, prompts, out, a) + VARIANTS[name], env, a.timeout)
            print(f"[{name} #{r}] rc={res['rc']} wall={res['wall_s']:.0f}s steps={sorted(res['steps'])} "
                  f"peak PSS={res['peak_pss_bytes'] / 2**20:.0f} MiB", flush=True)  # fmt: skip
            if res["tail"]:
                print(res["tail"])
            runs[name].append(res)

    def later_steps(name: str, key: str) -> list[float]:
        return [s[key] for res in runs[name] for st, s in res["steps"].items() if st >= 2 and key in s]

    samples_per_step = a.rollout_batch * a.n_samples
    forwards = -(-samples_per_step // a.micro_batch)
    rows = []
    base_me = median(later_steps("rollout", "timing/make_experience") or [float("nan")])
    base_tot = median(later_steps("rollout", "timing/step_total") or [float("nan")])
    base_mem = median([r["peak_pss_bytes"] for r in runs["rollout"]])
    for name in names:
        me = median(later_steps(name, "timing/make_experience") or [float("nan")])
        tot = median(later_steps(name, "timing/step_total") or [float("nan")])
        mem = median([r["peak_pss_bytes"] for r in runs[name]])
        rows.append({"run": name, "make_experience_s": me, "me_ratio_vs_rollout": me / base_me,
                     "step_total_s": tot, "step_ratio_vs_rollout": tot / base_tot,
                     "peak_PSS_MiB": mem / 2**20, "mem_ratio_vs_rollout": mem / base_mem,
                     "ref_forwards_per_step": 0 if name == "rollout" else forwards})  # fmt: skip
    env_info = environment(with_torch=False)
    print(
        f"\nreference cost: tiny Qwen2 ({n_params / 1e6:.2f}M params, hidden {a.hidden}, {a.layers} layers), "
        f"{a.rollout_batch} prompts x {a.n_samples} samples = {samples_per_step} experiences/step, "
        f"micro-batch {a.micro_batch}, {a.max_new_tokens} new tokens, ZeRO-0, CPU backend; "
        f"{a.repeats} alternating round(s); steps >= 2; load {env_info['loadavg_1m']:.1f}"
    )
    print(fmt_table(rows, list(rows[0])))
    result = {"args": vars(a), "env": env_info, "params": n_params, "rows": rows,
              "runs": {k: [{x: v for x, v in r.items() if x != "tail"} for r in vs] for k, vs in runs.items()}}  # fmt: skip
    write_json(a.json, result)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
