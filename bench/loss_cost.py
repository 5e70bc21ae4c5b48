"""Benchmark 1: forward+backward time and peak memory of every RPG loss vs OpenRLHF's.

Baseline (what ActorPPOTrainer.training_step computes with --algo.kl.use_loss, k3):
    actor_loss, clip_ratio, ppo_kl, _, _ = PolicyLoss(eps_low, eps_high)(logp, old, adv, mask)
    kl = compute_approx_kl(logp, ref, log_probs_old=old, kl_estimator="k3")
    kl_loss = aggregate_loss(kl, mask); logprobs_diff = masked_mean(logp - ref, mask)
    (actor_loss + kl_loss * beta).backward()
Candidate: rpg_openrlhf.core.compute_loss(name, style, ...) for every registered (name, style)
(loss, KL and metrics in one call; pi_ref = pi_old unless --with-ref), then .backward().

Both get the same tensors: logp (a leaf with grad, standing in for the policy's output),
old/ref log-probs, per-token advantages and a bool action mask with ragged lengths.
Times: interleaved rounds, median (bench/benchlib.py). Peak memory: CPU allocator events
through torch.profiler (benchlib.peak_cpu_bytes), or torch.cuda.max_memory_allocated on GPU.

    .venv/bin/python bench/loss_cost.py                       # 16 x 8192, fp32, CPU
    .venv/bin/python bench/loss_cost.py --compile             # adds torch.compile'd RPG losses
    .venv/bin/python bench/loss_cost.py --device cuda --dtype bf16   # on a GPU machine
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from benchlib import REPO, environment, fmt_table, interleaved_times, median, paired_ratio, write_json

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_openrlhf_loss() -> tuple[Any, Callable, Callable, Callable]:
    """(PolicyLoss, compute_approx_kl, aggregate_loss, masked_mean) from the installed OpenRLHF.

    openrlhf.models' package __init__ imports flash_attn; like OpenRLHF's own tests, load
    models/utils.py and models/loss.py by file path under a bare `openrlhf.models` package."""
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("openrlhf is not installed in this environment")
    root = Path(list(spec.submodule_search_locations)[0])
    import openrlhf  # noqa: F401  (the top-level package imports without flash_attn)

    # The bare package and the two modules stay registered (torch.compile looks globals up by
    # module name); this process imports nothing else from openrlhf.models.
    pkg = types.ModuleType("openrlhf.models")
    pkg.__path__ = [str(root / "models")]
    sys.modules["openrlhf.models"] = pkg
    mods = {}
    for name in ("utils", "loss"):
        s = importlib.util.spec_from_file_location(f"openrlhf.models.{name}", root / "models" / f"{name}.py")
        mod = importlib.util.module_from_spec(s)
        sys.modules[s.name] = mod
        s.loader.exec_module(mod)
        mods[name] = mod
    return (
        mods["loss"].PolicyLoss,
        mods["utils"].compute_approx_kl,
        mods["loss"].aggregate_loss,
        mods["utils"].masked_mean,
    )


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


def build_candidates(
    x: dict[str, torch.Tensor], args: argparse.Namespace
) -> tuple[dict[str, Callable[[], None]], list[str]]:
    """Closures running forward+backward of the baseline and of every RPG loss."""
    from rpg_openrlhf.core import LOSSES, LossConfig, compute_loss

    PolicyLoss, compute_approx_kl, aggregate_loss, masked_mean = load_openrlhf_loss()
    policy_loss = PolicyLoss(clip_eps_low=args.eps_low, clip_eps_high=args.eps_high)
    beta = args.beta
    logp, old, ref, adv, mask = x["logp"], x["old"], x["ref"], x["adv"], x["mask"]

    def openrlhf() -> None:
        actor_loss, clip_ratio, ppo_kl, _, _ = policy_loss(logp, old, adv, action_mask=mask)
        kl = compute_approx_kl(logp, ref, log_probs_old=old, kl_estimator="k3")
        kl_loss = aggregate_loss(kl, mask)
        logprobs_diff = masked_mean(logp.float() - ref.float(), mask)
        (actor_loss + kl_loss * beta).backward()
        # the metrics OpenRLHF logs, read back once (RPG's compute_loss returns floats)
        torch.stack([clip_ratio, ppo_kl, kl_loss.detach(), logprobs_diff]).tolist()
        logp.grad = None

    config = LossConfig(beta=beta, eps_low=args.eps_low, eps_high=args.eps_high)
    ref_logp = ref if args.with_ref else None
    fns: dict[str, Callable[[], None]] = {"openrlhf": openrlhf}
    rpg_names = []

    def rpg(name: str, style: str, loss_fn: Callable) -> Callable[[], None]:
        def run() -> None:
            loss, _metrics = loss_fn(name, style, logp, old, adv, mask, ref_logp, config)
            loss.backward()
            logp.grad = None

        return run

    compiled = None
    if args.compile:
        # one compiled graph per (name, style): raise Dynamo's per-function recompile limit
        torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)
        compiled = torch.compile(compute_loss)

        def openrlhf_loss(logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            actor_loss, clip_ratio, ppo_kl, _, _ = policy_loss(logp, old, adv, action_mask=mask)
            kl = compute_approx_kl(logp, ref, log_probs_old=old, kl_estimator="k3")
            kl_loss = aggregate_loss(kl, mask)
            logprobs_diff = masked_mean(logp.float() - ref.float(), mask)
            return actor_loss + kl_loss * beta, torch.stack(
                [clip_ratio, ppo_kl, kl_loss.detach(), logprobs_diff]
            )

        openrlhf_compiled = torch.compile(openrlhf_loss)

        def openrlhf_c() -> None:
            loss, metrics = openrlhf_compiled(logp)
            loss.backward()
            metrics.tolist()
            logp.grad = None

        fns["openrlhf+compile"] = openrlhf_c
    for name, style in sorted(LOSSES):
        key = f"{name}/{style}"
        fns[key] = rpg(name, style, compute_loss)
        rpg_names.append(key)
        if compiled is not None:
            fns[key + "+compile"] = rpg(name, style, compiled)
            rpg_names.append(key + "+compile")
    return fns, rpg_names


def sync(device: str) -> None:
    """Wait for queued GPU work (timing on CUDA)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


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

    return peak_cpu_bytes(fn)


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
    p.add_argument("--with-ref", action="store_true", help="RPG gets ref_logp too (general pi_ref)")
    p.add_argument("--compile", action="store_true", help="also time torch.compile(compute_loss)")
    p.add_argument("--only", default=None, help="comma-separated name/style keys to run (plus baseline)")
    p.add_argument("--json", default=None, help="write results to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")

    x = make_inputs(args.batch, args.tokens, DTYPES[args.dtype], args.device)
    fns, rpg_names = build_candidates(x, args)
    if args.only:
        keep = set(args.only.split(","))
        rpg_names = [n for n in rpg_names if n in keep or n.removesuffix("+compile") in keep]
        fns = {k: v for k, v in fns.items() if k.startswith("openrlhf") or k in rpg_names}

    def timed(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            fn()
            sync(args.device)

        return run

    times = interleaved_times({k: timed(v) for k, v in fns.items()}, args.repeats, warmup=3)
    peaks = {k: peak_bytes(v, args.device) for k, v in fns.items()}
    base_t, base_m = median(times["openrlhf"]), peaks["openrlhf"]
    rows = [{"variant": "openrlhf (PolicyLoss + k3 KL loss)", "ms": base_t * 1e3, "time_ratio": 1.0,
             "peak_MiB": base_m / 2**20, "mem_ratio": 1.0}]  # fmt: skip
    for k in (["openrlhf+compile"] if args.compile else []) + rpg_names:
        rows.append(
            {
                "variant": k,
                "ms": median(times[k]) * 1e3,
                "time_ratio": paired_ratio(times, k, "openrlhf"),
                "peak_MiB": peaks[k] / 2**20,
                "mem_ratio": peaks[k] / base_m,
            }
        )
    env = environment()
    print(
        f"loss cost: {args.batch} x {args.tokens} tokens, {args.dtype}, {args.device}, "
        f"{args.repeats} interleaved rounds (median), threads={env.get('torch_threads')}, "
        f"load {env['loadavg_1m']:.1f}, ref_logp={'given' if args.with_ref else 'None (pi_ref = pi_old)'}"
    )
    print(fmt_table(rows, ["variant", "ms", "time_ratio", "peak_MiB", "mem_ratio"]))
    eager = [r for r in rows[1:] if not r["variant"].endswith("+compile")]
    worst_t = max(eager, key=lambda r: r["time_ratio"])
    worst_m = max(eager, key=lambda r: r["mem_ratio"])
    print(
        f"eager worst time ratio {worst_t['time_ratio']:.3f} ({worst_t['variant']}), "
        f"worst memory ratio {worst_m['mem_ratio']:.3f} ({worst_m['variant']}); target <= 1.0"
    )
    fused = [
        r for r in rows[1:] if r["variant"].endswith("+compile") and not r["variant"].startswith("openrlhf")
    ]
    if fused:
        worst_f = max(fused, key=lambda r: r["time_ratio"])
        print(f"compiled worst time ratio {worst_f['time_ratio']:.3f} ({worst_f['variant']}); stretch <= 0.7")
    result = {"args": vars(args), "env": env, "rows": rows, "times_s": times, "peak_bytes": peaks}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
