#!/usr/bin/env python3
"""The paper's experiment matrix as rpg-train configs: one base, per-method and per-setting
overrides, one generated YAML file per experiment under configs/experiments/.

    python configs/experiments.py generate        # (re)write configs/experiments/*.yaml
    python configs/experiments.py list            # experiment names
    python configs/experiments.py argv NAME       # the rpg-train argv of NAME, one per line
    python configs/experiments.py env NAME        # KEY=VALUE lines of its environment
    python configs/experiments.py plan [DIR]      # each config's memory plan per GPU (rpg-train --dry-run)

A config file is ``{name, description, variant, paper, env, flags}``. ``flags`` maps an rpg-train flag
(without ``--``) to a value: ``true`` -> the bare flag, ``false``/``null`` -> omitted, a list ->
several values, anything else -> its string. Placeholders in values: ``{data}`` (env
``RPG_DATA``, default ``data/dapo_math_17k_en.jsonl`` from ``rpg-prepare-data --english-only``),
``{out}`` (env ``RPG_OUT``, default ``runs``), ``{name}`` and ``{reward_file}`` (the path of
``rpg_openrlhf/plugin/reward.py``). The generated files are checked in; a test asserts they
match this script.

Hyperparameters (docs: rpg-method.md, "Training setup of the paper"): AdamW lr 1e-6 (5e-7 for
RPG-REINFORCE), weight decay 0.1, grad clip 1.0, 10 warm-up rollout steps, 512 prompts x 16
samples per rollout, mini-batches of 32 prompts (16 optimizer steps per rollout), 400 rollout
steps (``--rpg.max_steps 400``, counted after dynamic sampling's refills), temperature 1.0,
dynamic sampling, DAPO overlong penalty, beta 1e-4, clip (0.2, 0.28), dual-clip c = 10 (the
paper's code, every PPO-clipped loss), the paper's +1/-1 reward, 8 GPUs.

Two variants of every paper run that the released code can express (docs/losses.md, "The
released code"): ``paper_text`` (the method as the paper writes it; names such as
``rpg_urkl-qwen3_4b-8k``) and ``released_code`` (``*_released-*``: trained exactly as the
released verl scripts did: the KL value clamped at 10, one mean per micro-batch, no rho weight,
and for RPG-REINFORCE dual-clip PPO with no KL at all, which is what those scripts run).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "experiments"
DEFAULT_DATA = "data/dapo_math_17k_en.jsonl"

PROMPTS_PER_STEP = 512
SAMPLES_PER_PROMPT = 16
MINIBATCH_PROMPTS = 32
DATASET_SIZE = 14_020  # rpg-prepare-data --english-only on DAPO-Math-17k (paper: 13.9k)
MAX_STEPS = 400  # rollout steps, as the paper's runs (Last = step 400): --rpg.max_steps stops there
# Only an upper bound: dynamic sampling refills rejected groups, so an episode (27.4 batches of 512
# prompts) gives 27.4 x pass-rate rollout steps; 100 episodes reach 400 steps at pass rates >= 15%.
EPISODES = 100
WARMUP_ROLLOUTS = 10
PROMPT_BUDGET = 1024

#: Flags every experiment shares (8 GPUs, colocated actor / reference / vLLM).
BASE: dict[str, Any] = {
    "actor.model_name_or_path": None,  # set by the setting
    "actor.num_nodes": 1,
    "actor.num_gpus_per_node": 8,
    "ref.num_nodes": 1,
    "ref.num_gpus_per_node": 8,
    "vllm.num_engines": 8,
    "vllm.tensor_parallel_size": 1,
    "vllm.gpu_memory_utilization": 0.6,
    "vllm.enable_sleep": True,
    "ds.enable_sleep": True,
    "train.colocate_all": True,
    "ds.zero_stage": 2,
    "ds.param_dtype": "bf16",
    "ds.attn_implementation": "flash_attention_2",
    "actor.gradient_checkpointing_enable": True,
    # Micro-batches by tokens, as OpenRLHF's own dynamic-batching examples (packed, no padding): the
    # per-GPU memory plan of every config then fits 80 GiB (rpg-train --dry-run; docs/training.md,
    # "Memory plan"). Fixed micro-batches of 8 / 4 padded sequences put the 8K configs at or over it.
    "ds.packing_samples": True,
    "train.dynamic_batch_enable": True,
    "train.max_tokens_per_gpu": 16192,
    "rollout.max_tokens_per_gpu": 32768,
    # data: the paper's prompt, DAPO-Math-17k English subset
    "data.prompt_dataset": "{data}",
    "data.input_key": "prompt",
    "data.label_key": "label",
    "data.apply_chat_template": True,
    "reward.remote_url": "{reward_file}",
    # rollout
    "rollout.batch_size": PROMPTS_PER_STEP,
    "rollout.n_samples_per_prompt": SAMPLES_PER_PROMPT,
    "rollout.temperature": 1.0,
    "rollout.top_p": 1.0,
    "algo.dynamic_filtering_enable": True,  # drop groups whose accuracy std is 0 (scores = accuracy)
    "algo.dynamic_filtering_range": [0, 1],
    # optimization
    "train.batch_size": MINIBATCH_PROMPTS * SAMPLES_PER_PROMPT,
    "train.max_epochs": 1,
    "train.num_episodes": EPISODES,
    "rpg.max_steps": MAX_STEPS,
    "train.seed": 42,
    "actor.adam.lr": 1e-6,
    "actor.adam.betas": [0.9, 0.999],  # verl's AdamW (the paper's code); OpenRLHF's default is 0.95
    "actor.adam.weight_decay": 0.1,
    "actor.max_norm": 1.0,
    # entropy logged, not optimized, for every method alike (detached: rpg_openrlhf/extras/entropy.py)
    "actor.entropy_coef": 0.0,
    "actor.lr_scheduler": "constant_with_warmup",
    # of the scheduler's length, which --rpg.max_steps sets to MAX_STEPS rollouts' optimizer steps
    "actor.lr_warmup_ratio": WARMUP_ROLLOUTS / MAX_STEPS,
    "actor.eps_clip_low_high": [0.2, 0.28],
    "actor.loss_agg_mode": "token-mean",
    # checkpoints every 10 rollout steps (the paper's Best is over checkpoints every 10 steps)
    "ckpt.save_steps": 10,
    "ckpt.save_hf": True,
    "ckpt.max_num": 2,
    "ckpt.path": "{out}/{name}/ckpt",
    "ckpt.output_dir": "{out}/{name}/final",
    "logger.tensorboard_dir": "{out}/{name}/tensorboard",
}

#: name -> (description, model, response budget, paper table, extra flags).
SETTINGS: dict[str, tuple[str, str, int, str, dict[str, Any]]] = {
    "qwen3_4b-2k": ("Qwen3-4B, 2K response budget", "Qwen/Qwen3-4B", 2048, "T6", {}),
    "qwen3_4b-4k": ("Qwen3-4B, 4K response budget", "Qwen/Qwen3-4B", 4096, "T5", {}),
    "qwen3_4b-8k": ("Qwen3-4B, 8K response budget", "Qwen/Qwen3-4B", 8192, "T3", {}),
    "qwen2_5_7b_instruct-2k": (
        "Qwen2.5-7B-Instruct, 2K response budget",
        "Qwen/Qwen2.5-7B-Instruct",
        2048,
        "T8",
        {"ds.zero_stage": 3},
    ),
}

#: OpenRLHF's PolicyLoss dual clip for the baselines: the released code runs every PPO loss with c = 10.
_DUAL_CLIP = {"actor.dual_clip": 10.0}
_RPG_DIFF = {
    "rpg.style": "differentiable",
    "rpg.beta": 1e-4,
    "rpg.clip_c": 10.0,  # the released code applies dual-clip c = 10 to the PPO reward term
    "rpg.advantage": "mean",
    "rpg.ref_update": "rollout",
}
_RPG_REINFORCE = {**_RPG_DIFF, "rpg.style": "reinforce_clip", "actor.adam.lr": 5e-7}
#: How the released code trains every run (verl dp_actor.update_policy): dual-clip PPO (c = 10)
#: plus kl_loss_coef times a KL penalty clamped to [-10, 10] and taken without rho, one token mean
#: per micro-batch. Its RPG-REINFORCE scripts set use_kl_loss=False and an in-reward KL
#: coefficient of 0: dual-clip PPO with the mean baseline and no KL (the REINFORCE loss is never
#: called), hence beta 0 there.
_RELEASED = {
    "rpg.style": "differentiable",
    "rpg.clip_c": 10.0,
    "rpg.kl_value_clamp": 10.0,
    "rpg.kl_rho": "off",
    "rpg.aggregation_scope": "micro_batch",
}
_RELEASED_NO_KL = {**_RELEASED, "rpg.beta": 0.0, "rpg.kl_value_clamp": None}

#: name -> (paper method name, description, flags). Baselines are OpenRLHF's own algorithms.
METHODS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "grpo": (
        "GRPO",
        "GRPO: group mean/std advantages, k3 KL loss to the initial model (beta 1e-4), clip 0.2",
        {
            "algo.advantage.estimator": "group_norm",
            "algo.kl.use_loss": True,
            "algo.kl.estimator": "k3",
            "algo.kl.init_coef": 1e-4,
            "actor.eps_clip_low_high": [0.2, 0.2],
            "actor.loss_agg_mode": "seq-mean-token-mean",
            **_DUAL_CLIP,
        },
    ),
    "dapo": (
        "DAPO",
        "DAPO: group mean/std advantages, clip-higher (0.2, 0.28), token-level loss, no KL",
        {"algo.advantage.estimator": "group_norm", "algo.kl.init_coef": 0.0, **_DUAL_CLIP},
    ),
    "reinforce_pp": (
        "REINFORCE++",
        "REINFORCE++: batch-normalized returns, k1 KL reward penalty to the initial model (1e-4)",
        {
            "algo.advantage.estimator": "reinforce",
            "algo.kl.init_coef": 1e-4,
            "algo.kl.estimator": "k1",
            **_DUAL_CLIP,
        },
    ),
    "reinforce_pp_baseline": (
        "REINFORCE++-Baseline",
        "REINFORCE++-baseline: group-mean baseline then batch normalization, k2 KL loss (1e-4)",
        {
            "algo.advantage.estimator": "reinforce_baseline",
            "algo.kl.use_loss": True,
            "algo.kl.estimator": "k2",
            "algo.kl.init_coef": 1e-4,
            **_DUAL_CLIP,
        },
    ),
    **{
        f"rpg_{d}": (
            f"RPG-{d.upper()}",
            f"RPG-{d.upper()}: fully differentiable {d.upper()} surrogate, pi_ref = pi_old, beta 1e-4",
            {"rpg.loss": d, **_RPG_DIFF},
        )
        for d in ("fkl", "rkl", "ufkl", "urkl")
    },
    **{
        f"rpg_reinforce_{d}": (
            f"RPG-REINFORCE-{d.upper()}",
            f"RPG-REINFORCE-{d.upper()}: RPG-Style Clip (dual clip c=10 on the regularized advantage), "
            "pi_ref = pi_old, beta 1e-4, lr 5e-7",
            {"rpg.loss": d, **_RPG_REINFORCE},
        )
        for d in ("fkl", "rkl", "ufkl", "urkl")
    },
    # ------------------------------------------------ the released code's runs (variant released_code)
    "grpo_released": (
        "GRPO",
        "GRPO as the released script (run_grpo_*.sh): mean/std advantages, k3 KL loss to the initial "
        "model clamped at 10, beta 1e-3, clip (0.2, 0.2), dual clip 10, a mean per micro-batch",
        {
            "rpg.loss": "grpo_kl",
            **_RELEASED,
            "rpg.beta": 1e-3,
            "rpg.advantage": "mean_std",
            "rpg.ref_update": "initial",
            "actor.eps_clip_low_high": [0.2, 0.2],
        },
    ),
    "dapo_released": (
        "DAPO",
        "DAPO as the released script (run_dapo_*.sh): mean/std advantages, clip (0.2, 0.28), dual clip 10, "
        "no KL, a mean per micro-batch",
        {"rpg.loss": "grpo_kl", **_RELEASED_NO_KL, "rpg.advantage": "mean_std", "rpg.ref_update": "rollout"},
    ),
    **{
        f"rpg_{d}_released": (
            f"RPG-{d.upper()}",
            f"RPG-{d.upper()} as the released script (run_rpg_*_{d}1e-4.sh): dual-clip PPO (c 10) + beta "
            f"rpg_{d} KL loss (clamped at 10, no rho), pi_ref = pi_old, a mean per micro-batch",
            {
                "rpg.loss": d,
                **_RELEASED,
                "rpg.beta": 1e-4,
                "rpg.advantage": "mean",
                "rpg.ref_update": "rollout",
            },
        )
        for d in ("fkl", "rkl", "ufkl", "urkl")
    },
    **{
        f"rpg_reinforce_{d}_released": (
            f"RPG-REINFORCE-{d.upper()}",
            f"RPG-REINFORCE-{d.upper()} as the released script (run_rpg_*_{d}1e-4_rf_clip_ppo_*.sh): "
            "use_kl_loss False and in-reward KL 0, i.e. dual-clip PPO (c 10) with the mean baseline and no "
            "KL, lr 5e-7, a mean per micro-batch",
            {
                "rpg.loss": d,
                **_RELEASED_NO_KL,
                "rpg.advantage": "mean",
                "rpg.ref_update": "rollout",
                "actor.adam.lr": 5e-7,
            },
        )
        for d in ("fkl", "rkl", "ufkl", "urkl")
    },
}


def experiment(method: str, setting: str) -> dict[str, Any]:
    """The config dict of one (method, setting)."""
    paper_method, method_desc, method_flags = METHODS[method]
    setting_desc, model, budget, table, setting_flags = SETTINGS[setting]
    name = f"{method}-{setting}"
    flags = dict(BASE)
    flags.update(
        {
            "actor.model_name_or_path": model,
            "rollout.max_new_tokens": budget,
            "data.max_len": PROMPT_BUDGET + budget,
            "reward.overlong_buffer_len": budget // 4,  # paper (2K): max 2048, buffer 512
            "reward.overlong_penalty_factor": 1.0,
            "logger.wandb.run_name": name,
        }
    )
    flags.update(setting_flags)
    flags.update(method_flags)
    return {
        "name": name,
        "description": f"{method_desc}; {setting_desc}",
        "variant": "released_code" if method.endswith("_released") else "paper_text",
        "paper": {
            "table": table,
            "method": paper_method,
            "model": model.split("/")[-1],
            "context": f"{budget // 1024}K",
        },
        "env": {"RPG_REWARD_GRADER": "paper"},
        "flags": flags,
    }


def all_experiments() -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in (experiment(m, s) for s in SETTINGS for m in METHODS)}


# ----------------------------------------------------------------------------- files
def dump(config: dict[str, Any]) -> str:
    import yaml

    header = (
        f"# {config['name']}: {config['description']}\n"
        "# Generated by configs/experiments.py (edit that, then: python configs/experiments.py generate).\n"
        f"# Run: scripts/run_config.sh {config['name']} [extra rpg-train flags]\n"
    )
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=110)


def generate(out_dir: Path = OUT_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, config in all_experiments().items():
        path = out_dir / f"{name}.yaml"
        path.write_text(dump(config), encoding="utf-8")
        paths.append(path)
    return paths


def load(name: str, config_dir: Path = OUT_DIR) -> dict[str, Any]:
    """The config of experiment ``name`` (a name under configs/experiments/ or a yaml path); a one-line
    SystemExit for an unknown name (with the closest names), unreadable YAML, or a file that is not a
    config (empty, a list, no ``flags`` mapping)."""
    import difflib

    import yaml

    path = Path(name) if name.endswith((".yaml", ".yml")) else config_dir / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in config_dir.glob("*.yaml"))
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        raise SystemExit(
            f"unknown experiment {name!r}; {'closest: ' + ', '.join(close) if close else 'no close name'} "
            f"(all {len(known)}: python configs/experiments.py list)"
        )
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        raise SystemExit(f"{path}: not readable as YAML ({type(e).__name__})") from None
    if not isinstance(config, dict) or not isinstance(config.get("flags"), dict):
        got = "empty" if config is None else f"a {type(config).__name__}"
        if isinstance(config, dict):
            got = "no 'flags' mapping"
        raise SystemExit(f"{path}: not an experiment config (a mapping with a 'flags' mapping), got {got}")
    if not isinstance(config.get("env") or {}, dict):
        raise SystemExit(f"{path}: 'env' must be a mapping of environment variables")
    config.setdefault("name", path.stem)
    return config


def reward_file() -> str:
    return str(HERE.parent / "rpg_openrlhf" / "plugin" / "reward.py")


def to_argv(config: dict[str, Any], data: str | None = None, out: str | None = None) -> list[str]:
    """rpg-train argv of a config (placeholders filled)."""
    values = {
        "data": data or os.environ.get("RPG_DATA", DEFAULT_DATA),
        "out": out or os.environ.get("RPG_OUT", "runs"),
        "name": config["name"],
        "reward_file": reward_file(),
    }
    argv: list[str] = []
    for key, value in config["flags"].items():
        if value is None or value is False:
            continue
        argv.append(f"--{key}")
        if value is True:
            continue
        for item in value if isinstance(value, list) else [value]:
            try:
                argv.append(str(item).format(**values) if isinstance(item, str) else str(item))
            except (KeyError, IndexError, ValueError, AttributeError) as e:
                raise SystemExit(
                    f"{config['name']}: flag {key}: {item!r}: unknown or malformed placeholder ({e}); "
                    f"known: {', '.join('{' + k + '}' for k in values)}"
                ) from None
    return argv


def memory_plans(config_dir: Path = OUT_DIR) -> list[str]:
    """One line per config: its memory plan's per-GPU peak of each phase (GiB) and whether it fits,
    from ``rpg-train NAME --dry-run`` run in this process (the CPU backend plans the GPU shape)."""
    import contextlib
    import io
    import json

    from rpg_openrlhf.launch.cli import main as rpg_train

    # a dry-run downloads nothing; offline mode would only make it refuse the uncached hub ids
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.pop(key, None)
    phases = ("rollout engines", "log-prob forward", "reference forward", "training step")
    lines = ["config | " + " | ".join(phases) + " | fits (GiB per GPU)"]
    for path in sorted(config_dir.glob("*.yaml")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rpg_train(
                [
                    *to_argv(load(str(path)), data="/data.jsonl", out="/runs"),
                    "--rpg.backend",
                    "cpu",
                    "--dry-run",
                ]
            )
        text = out.getvalue()
        plan = json.loads(text[text.index("{") :])["memory_plan"]
        totals = [f"{plan['phases'][p]['total_gib']:.1f}" if p in plan["phases"] else "-" for p in phases]
        lines.append(f"{path.stem} | " + " | ".join(totals) + f" | {'yes' if plan['fits'] else 'NO'}")
    return lines


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("generate", "list", "argv", "env", "plan"):
        print(__doc__, file=sys.stderr)
        return 2
    cmd = argv[0]
    if cmd == "generate":
        for path in generate():
            print(path.relative_to(HERE.parent))
    elif cmd == "plan":
        print("\n".join(memory_plans(Path(argv[1]) if len(argv) > 1 else OUT_DIR)))
    elif cmd == "list":
        print("\n".join(sorted(p.stem for p in OUT_DIR.glob("*.yaml"))))
    elif len(argv) != 2:
        print(f"usage: {sys.argv[0]} {cmd} NAME", file=sys.stderr)
        return 2
    elif cmd == "argv":
        print("\n".join(to_argv(load(argv[1]))))
    else:
        for key, value in (load(argv[1]).get("env") or {}).items():
            print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
