"""Benchmark 1: what RPG's losses cost inside a whole training step, two ratios from one run.

One step = hidden states -> per-token log-probs -> policy loss -> backward (gradients of the hidden
states and the LM head), at bench/logprob_memory.py's shape: Qwen3's vocabulary V 151,936, hidden
256, N 2,048 tokens (4 sequences x 512, ragged masks), fp32, CPU (a head small enough for two cores,
which makes the loss a larger share of the step than on a real model).

  (a) the loss inside the step: RPG's step (core.logprobs.chunked_logprobs, core.compute_loss(name,
      style) with its metrics and input checks, backward) against the same step with OpenRLHF's loss
      on the same log-prob path: PolicyLoss(0.2, 0.28, dual_clip=10) + compute_approx_kl(k3) x beta +
      aggregate_loss + masked_mean, as ActorPPOTrainer.training_step adds them with
      --algo.kl.use_loss, its four metrics read back. Target: <= 1.02x time, <= 1.01x peak memory.
  (b) what a user gets: RPG's step (as in a) against OpenRLHF's stock step: the full [N, V] logits as
      Actor.forward forms them (head, fp32 cast), log_probs_from_logits, the same OpenRLHF loss.
Both sides get a separate reference (ref_logp) and the same dual clip c = 10, beta 1e-4.

Time: in every round each RPG step runs right next to its own (a) baseline (order alternating,
candidates rotated) and the stock step runs once; a ratio is the median over rounds of the ratio
within a round (load on a shared machine hits both calls alike). Peak: CPU tensor bytes allocated
and alive in the step (benchlib.peak_cpu_bytes; inputs and weights made before it count zero).

    .venv/bin/python bench/loss_cost.py                     # each style on urkl + GRPO's two, 1 round
    .venv/bin/python bench/loss_cost.py --variants paper --json bench/results/loss_cost.json  # the 22 losses
    .venv/bin/python bench/loss_cost.py --report bench/results/loss_cost.json   # the table of a saved run
    .venv/bin/python bench/loss_cost.py --device cuda --dtype bf16 --variants paper   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from benchlib import environment, fmt_table, median, paired_ratio, peak_cpu_bytes, write_json

TARGET = {"time": 1.02, "memory": 1.01}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BETA, EPS_LOW, EPS_HIGH, CLIP_C = 1e-4, 0.2, 0.28, 10.0


def load_openrlhf() -> tuple[Any, Any]:
    """(openrlhf.models.utils, openrlhf.models.loss) of the installed OpenRLHF, loaded by file path
    (its package __init__ imports flash_attn): the conformance's loader."""
    from rpg_openrlhf.mechanisms.upstream import openrlhf_loss_modules

    try:
        return openrlhf_loss_modules()
    except ModuleNotFoundError as e:
        raise SystemExit(str(e)) from None


def make_inputs(vocab: int, hidden: int, batch: int, tokens: int, seed: int = 0, device: str = "cpu",
                dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:  # fmt: skip
    """The head and hidden states (leaves with grad), labels, and per-token old/ref log-probs a little
    off the policy's, group-style advantages, ragged response lengths."""
    g = torch.Generator().manual_seed(seed)
    n = batch * tokens
    x = {
        "weight": torch.randn(vocab, hidden, generator=g) * hidden**-0.5,
        "hidden": torch.randn(n, hidden, generator=g),
        "labels": torch.randint(0, vocab, (n,), generator=g),
        "old_noise": 0.15 * torch.randn(batch, tokens, generator=g),
        "ref_noise": 0.05 * torch.randn(batch, tokens, generator=g),
        "adv": torch.randn(batch, 1, generator=g).expand(batch, tokens).contiguous(),
    }
    lengths = torch.randint(tokens // 4, tokens + 1, (batch,), generator=g)
    x["mask"] = torch.arange(tokens)[None] < lengths[:, None]
    from rpg_openrlhf.core.logprobs import chunked_logprobs

    with torch.no_grad():  # pi_old and pi_ref: the policy's log-probs, perturbed
        logp = chunked_logprobs(x["hidden"], x["weight"], x["labels"])[0].reshape(batch, tokens)
    x["old"], x["ref"] = logp + x.pop("old_noise"), logp + x.pop("ref_noise")
    x = {k: v.to(device) for k, v in x.items()}
    for k in ("weight", "hidden"):  # the head and the hidden states in the model's dtype, leaves with grad
        x[k] = x[k].to(dtype).requires_grad_(True)
    return x


def build_steps(
    x: dict[str, torch.Tensor], keys: list[tuple[str, str]]
) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> one training step (forward + backward, its metrics read back; returns the loss, the
    gradients are left in x['hidden'].grad and x['weight'].grad): 'openrlhf (chunked)',
    'openrlhf (stock)' and one per RPG loss ('name/style')."""
    from rpg_openrlhf.core import LossConfig, compute_loss
    from rpg_openrlhf.core.logprobs import chunked_logprobs

    utils, loss_mod = load_openrlhf()
    policy = loss_mod.PolicyLoss(clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH, dual_clip=CLIP_C)
    shape, mask, old, ref, adv = x["old"].shape, x["mask"], x["old"], x["ref"], x["adv"]
    config = LossConfig(beta=BETA, eps_low=EPS_LOW, eps_high=EPS_HIGH, clip_c=CLIP_C)

    def chunked() -> torch.Tensor:
        return chunked_logprobs(x["hidden"], x["weight"], x["labels"])[0].reshape(shape)

    def stock() -> torch.Tensor:  # Actor.forward: the head in the weights' dtype, cast to fp32
        logits = torch.nn.functional.linear(x["hidden"], x["weight"])[None].to(torch.float32)
        return utils.log_probs_from_logits(logits, x["labels"][None]).reshape(shape)

    def openrlhf_step(logprobs: Callable[[], torch.Tensor]) -> torch.Tensor:
        x["hidden"].grad = x["weight"].grad = None
        logp = logprobs()
        actor_loss, clip_ratio, ppo_kl, _, _ = policy(logp, old, adv, action_mask=mask)
        kl = utils.compute_approx_kl(logp, ref, log_probs_old=old, kl_estimator="k3")
        kl_loss = loss_mod.aggregate_loss(kl, mask)
        logprobs_diff = utils.masked_mean(logp.detach() - ref, mask)
        loss = actor_loss + kl_loss * BETA
        loss.backward()
        torch.stack([kl_loss.detach(), clip_ratio, ppo_kl, logprobs_diff]).tolist()
        return loss.detach()

    def rpg_step(name: str, style: str) -> torch.Tensor:
        x["hidden"].grad = x["weight"].grad = None
        loss, _ = compute_loss(name, style, chunked(), old, adv, mask, ref, config)  # metrics: one host sync
        loss.backward()
        return loss.detach()

    steps: dict[str, Callable[[], torch.Tensor]] = {
        "openrlhf (chunked)": lambda: openrlhf_step(chunked),
        "openrlhf (stock)": lambda: openrlhf_step(stock),
    }
    steps.update({f"{n}/{s}": (lambda n=n, s=s: rpg_step(n, s)) for n, s in keys})
    return steps


def timed(steps: dict[str, Callable[[], Any]], candidates: list[str], repeats: int) -> dict[str, list[float]]:
    """Seconds per step in `repeats` rounds: each candidate next to the (a) baseline (order alternating,
    candidates rotated; '<name> | base' holds the baseline's time of that pair), the stock step once.
    No warm-up of its own: main measures every step's peak first."""
    import time

    def clock(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    base, stock = "openrlhf (chunked)", "openrlhf (stock)"
    times: dict[str, list[float]] = {k: [] for k in (stock, *candidates)}
    pairs: dict[str, list[float]] = {k: [] for k in candidates}
    for r in range(repeats):
        times[stock].append(clock(steps[stock]))
        k = r % len(candidates)
        for i, name in enumerate(candidates[k:] + candidates[:k]):
            first, second = (base, name) if (r + i) % 2 == 0 else (name, base)
            t = {first: clock(steps[first]), second: clock(steps[second])}
            times[name].append(t[name])
            pairs[name].append(t[base])
    return {**times, **{f"{k} | base": v for k, v in pairs.items()}}


def peak_of(x: dict[str, torch.Tensor], step: Callable[[], Any]) -> int:
    """The step's peak bytes, its gradients cleared before the region (a gradient freed inside it
    would lower the peak by its size: 155 MiB for the head's at the default shape)."""
    x["hidden"].grad = x["weight"].grad = None
    if x["hidden"].device.type != "cuda":
        return peak_cpu_bytes(step)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def rows_of(result: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for r in result["rows"]:
        ok = r["time_ratio"] <= TARGET["time"] and r["mem_ratio"] <= TARGET["memory"]
        rows.append({
            "loss": r["variant"],
            "(a) time": f"{r['time_ratio']:.3f}",
            "(a) peak": f"{r['mem_ratio']:.4f}",
            "(b) time": f"{r['user_time_ratio']:.3f}",
            "(b) peak": f"{r['user_mem_ratio']:.4f}",
            "(a) met": "yes" if ok else "no",
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tokens", type=int, default=512, help="tokens per sequence (N = batch x tokens)")
    p.add_argument("--repeats", type=int, default=1, help="timed rounds")
    p.add_argument("--variants", choices=("styles", "paper", "all"), default="styles",
                   help="styles: each style on urkl, and GRPO's two (7 losses); paper: the paper's 22 losses; "
                   "all: + every framework KL option")  # fmt: skip
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--dtype", choices=tuple(DTYPES), default="fp32", help="the head's and hidden states' dtype"
    )
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--json", default=None, help="write the results to this file")
    p.add_argument("--report", default=None, help="print the table of a saved --json run and exit")
    args = p.parse_args(argv)
    if args.report:
        try:
            saved = json.loads(Path(args.report).read_text())
        except (OSError, ValueError) as e:
            p.error(f"--report {args.report}: cannot read it ({e})")
        print(fmt_table(rows_of(saved), list(rows_of(saved)[0])))
        return saved
    for flag in ("vocab", "hidden", "batch", "tokens", "repeats"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag}: must be >= 1, got {getattr(args, flag)}")
    if args.threads:
        torch.set_num_threads(args.threads)

    from rpg_openrlhf.core import LOSS_NAMES, LOSSES, STYLES

    paper = {k for k in LOSSES if k[0] in LOSS_NAMES and k[1] in STYLES}
    styles = {k for k in paper if k[0] in ("urkl", "grpo_kl", "grpo_kl_corrected")}
    keys = sorted({"styles": styles, "paper": paper, "all": set(LOSSES)}[args.variants])
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible")
    x = make_inputs(
        args.vocab, args.hidden, args.batch, args.tokens, device=args.device, dtype=DTYPES[args.dtype]
    )
    steps = build_steps(x, keys)
    env_before = environment()
    peak = {name: peak_of(x, fn) for name, fn in steps.items()}
    candidates = [f"{n}/{s}" for n, s in keys]
    times = timed(steps, candidates, args.repeats)
    base, stock = peak["openrlhf (chunked)"], peak["openrlhf (stock)"]
    base_times = [t for name in candidates for t in times[f"{name} | base"]]
    rows = []
    for name in candidates:
        pair = {"cand": times[name], "base": times[f"{name} | base"], "stock": times["openrlhf (stock)"]}
        rows.append({
            "variant": name,
            "time_ratio": paired_ratio(pair, "cand", "base"),
            "mem_ratio": peak[name] / base,
            "user_time_ratio": paired_ratio(pair, "cand", "stock"),
            "user_mem_ratio": peak[name] / stock,
            "seconds": median(times[name]),
            "peak_bytes": peak[name],
        })  # fmt: skip
    result = {
        "args": vars(args),
        "targets": {"a_time": TARGET["time"], "a_memory": TARGET["memory"]},
        "baselines": {
            "openrlhf_chunked": {"seconds": median(base_times), "peak_bytes": base},
            "openrlhf_stock": {"seconds": median(times["openrlhf (stock)"]), "peak_bytes": stock},
        },
        "rows": rows,
        "env_before": env_before,
        "environment": environment(),
    }
    n = args.batch * args.tokens
    print(f"V={args.vocab} H={args.hidden} N={n} ({args.batch} x {args.tokens}) {args.dtype} {args.device}, "
          f"{args.repeats} rounds; "
          f"OpenRLHF on the chunked path {median(base_times):.2f} s, {base / 2**20:.0f} MiB; "
          f"stock {median(times['openrlhf (stock)']):.2f} s, {stock / 2**20:.0f} MiB")  # fmt: skip
    print(fmt_table(rows_of(result), list(rows_of(result)[0])))
    a_time = [r["time_ratio"] for r in rows]
    a_mem = [r["mem_ratio"] for r in rows]
    print(f"(a) time {min(a_time):.3f}-{max(a_time):.3f}x, peak {min(a_mem):.4f}-{max(a_mem):.4f}x "
          f"(targets <= {TARGET['time']}, <= {TARGET['memory']}); (b) time "
          f"{min(r['user_time_ratio'] for r in rows):.3f}-{max(r['user_time_ratio'] for r in rows):.3f}x, peak "
          f"{min(r['user_mem_ratio'] for r in rows):.4f}-{max(r['user_mem_ratio'] for r in rows):.4f}x")  # fmt: skip
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
