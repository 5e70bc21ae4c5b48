"""Benchmark 1: forward+backward time and peak memory of every RPG loss vs OpenRLHF doing the same work.

Two like-for-like pairs, each side with the same KL reference:
  old  pi_ref = pi_old (the paper's code): RPG with ref_logp=None; OpenRLHF's k3 KL loss taken
       against the rollout policy's log-probs (log_probs_base = old), which is how OpenRLHF
       expresses pi_ref = pi_old.
  ref  a separate reference model: both get ref_logp (RPG: rho = pi_ref / pi_old; OpenRLHF: k3
       against it).
OpenRLHF side (what ActorPPOTrainer.training_step computes with --algo.kl.use_loss, k3):
    actor_loss, clip_ratio, ppo_kl, _, _ = PolicyLoss(eps_low, eps_high, dual_clip=c)(logp, old, adv, mask)
    kl = compute_approx_kl(logp, base, log_probs_old=old, kl_estimator="k3")
    kl_loss = aggregate_loss(kl, mask); logprobs_diff = masked_mean(logp - base, mask)
    (actor_loss + kl_loss * beta).backward(); the four metrics read back once
RPG side: rpg_openrlhf.core.compute_loss(name, style, ...) (loss, KL and seven metrics, one host
sync, input checks), then .backward(). Eager against eager, torch.compile against torch.compile
(--compile), the same dual clip c on both sides.

Both get the same tensors: logp (a leaf with grad, standing in for the policy's output),
old/ref log-probs, per-token advantages and a bool action mask with ragged lengths.
Times: adjacent pairs. In every round each candidate runs right next to its own baseline (the
order alternating between rounds, candidates rotated), and its ratio is the median over rounds
of candidate time / baseline time of the same pair: background load on a shared machine hits
both calls of a pair alike (bench/benchlib.py's interleaving, one step tighter). Peak memory: CPU allocator events through torch.profiler
(benchlib.peak_cpu_bytes; the profiler's USDT lines on stderr are suppressed), or
torch.cuda.max_memory_allocated on GPU.

    .venv/bin/python bench/loss_cost.py                                  # 16 x 8192, fp32, CPU, both pairs
    .venv/bin/python bench/loss_cost.py --compile                        # + compiled against compiled
    .venv/bin/python bench/loss_cost.py --variants released              # the released code's styles
    .venv/bin/python bench/loss_cost.py --compile --loss-only            # the loss alone, no metrics/checks
    .venv/bin/python bench/loss_cost.py --report bench/results/loss_cost.json   # Markdown rows of a saved run
    .venv/bin/python bench/loss_cost.py --device cuda --dtype bf16 --batch 8 --tokens 8192 --compile
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from benchlib import REPO, environment, fmt_table, median, write_json

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PAIRS = {"old": "pi_ref = pi_old", "ref": "separate reference"}
TARGET = 0.7


def load_openrlhf_loss() -> tuple[Any, Callable, Callable, Callable]:
    """(PolicyLoss, compute_approx_kl, aggregate_loss, masked_mean) from the installed OpenRLHF.

    openrlhf.models' package __init__ imports flash_attn; like OpenRLHF's own tests, models/utils.py and
    models/loss.py are loaded by file path under a bare `openrlhf.models` package (the conformance's
    loader, rpg_openrlhf/mechanisms/upstream.py; they stay registered: torch.compile looks globals up by
    module name, and this process imports nothing else from openrlhf.models)."""
    from rpg_openrlhf.mechanisms.upstream import openrlhf_loss_modules

    try:
        utils, loss = openrlhf_loss_modules()
    except ModuleNotFoundError as e:
        raise SystemExit(str(e)) from None
    return loss.PolicyLoss, utils.compute_approx_kl, loss.aggregate_loss, utils.masked_mean


def make_inputs(
    batch: int, tokens: int, dtype: torch.dtype, device: str, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Realistic tensors: log-probs <= 0, a policy a little off the rollout policy (so that some
    tokens clip), group-style advantages broadcast per token, ragged response lengths."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, tokens, generator=g).pow(2) * 3
    logp = old + 0.15 * torch.randn(batch, tokens, generator=g)
    ref = old + 0.05 * torch.randn(batch, tokens, generator=g)
    adv = torch.randn(batch, 1, generator=g).expand(batch, tokens).contiguous()
    lengths = torch.randint(tokens // 4, tokens + 1, (batch,), generator=g)
    mask = torch.arange(tokens).unsqueeze(0) < lengths.unsqueeze(1)
    out = {"old": old, "ref": ref, "adv": adv, "mask": mask}
    out = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in out.items()}
    out["logp"] = logp.to(device=device, dtype=dtype).requires_grad_(True)
    return out


def variant_keys(which: str) -> list[tuple[str, str]]:
    from rpg_openrlhf.core import LOSSES

    released = {k for k in LOSSES if k[1].endswith("_released")}
    keys = {"paper": set(LOSSES) - released, "released": released, "all": set(LOSSES)}[which]
    return sorted(keys)


def build_candidates(
    x: dict[str, torch.Tensor], args: argparse.Namespace
) -> tuple[dict[str, Callable[[], None]], list[str]]:
    """Closures running forward+backward: OpenRLHF and every RPG variant, per pair (and compiled)."""
    from rpg_openrlhf.core import LossConfig, aggregate, compute_loss

    PolicyLoss, compute_approx_kl, aggregate_loss, masked_mean = load_openrlhf_loss()
    policy_loss = PolicyLoss(clip_eps_low=args.eps_low, clip_eps_high=args.eps_high, dual_clip=args.clip_c)
    beta = args.beta
    logp, old, adv, mask = x["logp"], x["old"], x["adv"], x["mask"]
    config = LossConfig(beta=beta, eps_low=args.eps_low, eps_high=args.eps_high, clip_c=args.clip_c)

    def openrlhf_loss(logp: torch.Tensor, base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actor_loss, clip_ratio, ppo_kl, _, _ = policy_loss(logp, old, adv, action_mask=mask)
        kl = compute_approx_kl(logp, base, log_probs_old=old, kl_estimator="k3")
        kl_loss = aggregate_loss(kl, mask)
        if args.loss_only:  # (eager still computes PolicyLoss's metrics; compiled drops them)
            return actor_loss + kl_loss * beta, actor_loss.new_zeros(0)
        logprobs_diff = masked_mean(logp.float() - base.float(), mask)
        metrics = torch.stack([clip_ratio, ppo_kl, kl_loss.detach(), logprobs_diff])
        return actor_loss + kl_loss * beta, metrics

    def rpg_loss_only(name, style, logp, old_logp, advantages, action_mask, ref_logp, config):
        """The aggregated RPG loss alone: no metrics, no input checks, no host sync."""
        from rpg_openrlhf.core.losses import _loss_and_terms

        per_token, terms, _, _ = _loss_and_terms(
            name, style, logp, old_logp, advantages, action_mask, ref_logp, config
        )
        return aggregate(per_token, terms.mask, config.aggregation), None

    rpg_fn = rpg_loss_only if args.loss_only else compute_loss
    if args.compile:
        # one compiled graph per (name, style, pair): raise Dynamo's per-function recompile limit
        torch._dynamo.config.recompile_limit = max(128, torch._dynamo.config.recompile_limit)
        rpg_compiled = torch.compile(rpg_fn)

    def openrlhf(loss_fn: Callable, base: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            loss, metrics = loss_fn(logp, base)
            loss.backward()
            metrics.tolist()  # the metrics OpenRLHF logs, read back once
            logp.grad = None

        return run

    def rpg(name: str, style: str, loss_fn: Callable, ref_logp: torch.Tensor | None) -> Callable[[], None]:
        def run() -> None:
            loss, _metrics = loss_fn(name, style, logp, old, adv, mask, ref_logp, config)
            loss.backward()
            logp.grad = None

        return run

    fns: dict[str, Callable[[], None]] = {}
    rpg_names = []
    openrlhf_compiled = torch.compile(openrlhf_loss) if args.compile else None
    for pair in args.pairs.split(","):
        base, ref_logp = (old, None) if pair == "old" else (x["ref"], x["ref"])
        fns[f"openrlhf@{pair}"] = openrlhf(openrlhf_loss, base)
        if args.compile:
            fns[f"openrlhf@{pair}+compile"] = openrlhf(openrlhf_compiled, base)
        for name, style in variant_keys(args.variants):
            key = f"{name}/{style}@{pair}"
            fns[key] = rpg(name, style, rpg_fn, ref_logp)
            rpg_names.append(key)
            if args.compile:
                fns[key + "+compile"] = rpg(name, style, rpg_compiled, ref_logp)
    return fns, rpg_names


def sync(device: str) -> None:
    """Wait for queued GPU work (timing on CUDA)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence fd 2 (the profiler's C++ 'USDT ... profiler_start/stop' lines) for a moment."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def peak_bytes(fn: Callable[[], None], device: str) -> int:
    """Peak tensor bytes allocated during fn (CPU: allocator events; CUDA: max_memory_allocated)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from benchlib import peak_cpu_bytes

    with quiet_stderr():
        return peak_cpu_bytes(fn)


def baseline_of(key: str) -> str:
    """The OpenRLHF candidate doing the same work: same pair, compiled if key is."""
    pair = key.rsplit("@", 1)[1].removesuffix("+compile")
    return f"openrlhf@{pair}" + ("+compile" if key.endswith("+compile") else "")


def adjacent_pair_times(
    fns: dict[str, Callable[[], None]], candidates: list[str], repeats: int, warmup: int = 3
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(seconds per call of every fn, per-round time ratio of every candidate to its baseline).
    Each round runs every candidate next to its baseline (order alternating per round,
    candidates rotated)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    ratios: dict[str, list[float]] = {k: [] for k in candidates}
    for r in range(repeats):
        k = r % len(candidates)
        for cand in candidates[k:] + candidates[:k]:
            base = baseline_of(cand)
            measured = {}
            for name in (cand, base) if r % 2 else (base, cand):
                t0 = time.perf_counter()
                fns[name]()
                measured[name] = time.perf_counter() - t0
            times[cand].append(measured[cand])
            times[base].append(measured[base])
            ratios[cand].append(measured[cand] / measured[base])
    return times, ratios


def ratio_rows(
    times: dict[str, list[float]],
    ratios: dict[str, list[float]],
    peaks: dict[str, int],
    rpg_names: list[str],
    compiled: bool,
) -> list[dict[str, Any]]:
    """One row per (variant, pair): eager vs eager OpenRLHF, compiled vs compiled OpenRLHF."""
    rows = []
    for key in rpg_names:
        base = baseline_of(key)
        row = {
            "variant": key.rsplit("@", 1)[0],
            "pair": key.rsplit("@", 1)[1],
            "ms": median(times[key]) * 1e3,
            "time_ratio": median(ratios[key]),
            "mem_ratio": peaks[key] / peaks[base],
        }
        if compiled:
            ck = key + "+compile"
            row["ms_compiled"] = median(times[ck]) * 1e3
            row["time_ratio_compiled"] = median(ratios[ck])
            row["mem_ratio_compiled"] = peaks[ck] / peaks[baseline_of(ck)]
        rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]], compiled: bool) -> list[str]:
    """Worst ratios per pair and mode, against the target."""
    lines = []
    for pair in dict.fromkeys(r["pair"] for r in rows):
        sel = [r for r in rows if r["pair"] == pair]
        for suffix, label in [("", "eager"), ("_compiled", "compiled")][: 2 if compiled else 1]:
            t = max(sel, key=lambda r: r["time_ratio" + suffix])
            m = max(sel, key=lambda r: r["mem_ratio" + suffix])
            met = sum(r["time_ratio" + suffix] <= TARGET and r["mem_ratio" + suffix] <= TARGET for r in sel)
            lines.append(
                f"{PAIRS[pair]}, {label}: worst time {t['time_ratio' + suffix]:.2f} ({t['variant']}), "
                f"worst memory {m['mem_ratio' + suffix]:.2f} ({m['variant']}); "
                f"{met} of {len(sel)} variants <= {TARGET} in both"
            )
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The bench/README.md table of a saved run: one row per variant, both pairs side by side."""
    rows, compiled = result["rows"], result["args"]["compile"]
    pairs = list(dict.fromkeys(r["pair"] for r in rows))
    head = ["variant"]
    for pair in pairs:
        head += [f"{pair}: time", f"{pair}: memory"] + (
            [f"{pair}: compiled time", f"{pair}: compiled memory"] if compiled else []
        )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_key = {(r["variant"], r["pair"]): r for r in rows}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        cells = [variant]
        for pair in pairs:
            r = by_key[(variant, pair)]
            cells += [f"{r['time_ratio']:.2f}", f"{r['mem_ratio']:.2f}"]
            if compiled:
                cells += [f"{r['time_ratio_compiled']:.2f}", f"{r['mem_ratio_compiled']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    base = ", ".join(
        f"{k} {v['ms']:.2f} ms / {v['peak_MiB']:.2f} MiB" for k, v in result["baselines"].items()
    )
    lines.append(
        f"\nOpenRLHF (median): {base}; load {result['env_before']['loadavg_1m']:.1f} -> {result['env']['loadavg_1m']:.1f}."
    )
    lines += summary(rows, compiled)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table, return the results."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=15, help="interleaved rounds (median)")
    p.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: least noisy on a shared machine)"
    )
    p.add_argument("--beta", type=float, default=1e-4)
    p.add_argument("--eps-low", type=float, default=0.2)
    p.add_argument("--eps-high", type=float, default=0.28)
    p.add_argument(
        "--clip-c", type=float, default=10.0, help="dual clip c on both sides (the paper's code: 10)"
    )
    p.add_argument(
        "--pairs", default="old,ref", help="old (pi_ref = pi_old), ref (separate reference), or both"
    )
    p.add_argument("--variants", choices=["paper", "released", "all"], default="paper")
    p.add_argument("--compile", action="store_true", help="also compiled RPG vs compiled OpenRLHF")
    p.add_argument(
        "--loss-only",
        action="store_true",
        help="both sides compute the loss alone: no metrics, checks or read-back",
    )
    p.add_argument("--json", default=None, help="write results to this file")
    p.add_argument("--report", default=None, help="print the Markdown table of a saved --json run and exit")
    args = p.parse_args(argv)
    if args.report:
        import json

        result = json.loads(Path(args.report).read_text())
        print(markdown(result))
        return result
    if set(args.pairs.split(",")) - set(PAIRS):
        raise SystemExit(f"--pairs: expected a comma-separated subset of {sorted(PAIRS)}, got {args.pairs!r}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")

    x = make_inputs(args.batch, args.tokens, DTYPES[args.dtype], args.device)
    fns, rpg_names = build_candidates(x, args)

    def timed(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            fn()
            sync(args.device)

        return run

    env_before = environment()
    # the baselines are "openrlhf@<pair>" (a registered KL option may be named openrlhf_*)
    candidates = [k for k in fns if not k.startswith("openrlhf@")]
    times, ratios = adjacent_pair_times({k: timed(v) for k, v in fns.items()}, candidates, args.repeats)
    peaks = {k: peak_bytes(v, args.device) for k, v in fns.items()}
    env = environment()
    rows = ratio_rows(times, ratios, peaks, rpg_names, args.compile)
    baselines = {
        k: {"ms": median(times[k]) * 1e3, "peak_MiB": peaks[k] / 2**20}
        for k in fns
        if k.startswith("openrlhf@")
    }
    print(
        f"loss cost: {args.batch} x {args.tokens} tokens, {args.dtype}, {args.device}, dual clip c={args.clip_c:g}, "
        f"{args.repeats} rounds of adjacent pairs (median ratio), threads={env.get('torch_threads')}, "
        f"load {env_before['loadavg_1m']:.1f} -> {env['loadavg_1m']:.1f}"
    )
    print(fmt_table([{"baseline": k, **v} for k, v in baselines.items()], ["baseline", "ms", "peak_MiB"]))
    cols = ["variant", "pair", "ms", "time_ratio", "mem_ratio"]
    if args.compile:
        cols += ["ms_compiled", "time_ratio_compiled", "mem_ratio_compiled"]
    print(fmt_table(rows, cols))
    for line in summary(rows, args.compile):
        print(line)
    result = {
        "args": vars(args),
        "env_before": env_before,
        "env": env,
        "baselines": baselines,
        "rows": rows,
        "times_s": times,
        "ratios": ratios,
        "peak_bytes": peaks,
    }
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
