"""How far the rollout-engine mismatch moves the expected gradient, with and without correction
(the figures docs/losses.md and bench/README.md quote).

The policy of tests/test_core_exact.py (vocabulary 3, length 3, 27 sequences, tabular logits per
prefix, float64), pi_ref = pi_old (the paper's runs). The samples come from mu, pi_old's logits plus
`delta` times a fixed N(0, 1) direction per logit (the engine's mismatch, controlled); the expected
gradient of the loss is the exact mu-weighted sum over the 27 sequences. It is compared, in one run,
with the reference gradient the loss has when the samples come from pi_old:
  token weights  urkl / reinforce_clip, the paper's windows (0.2, 0.28), c = 10, weight_level
                 token (the paper's code); reference: the same loss's expected gradient under pi_old.
  seq weights    urkl / reinforce_clip, wide windows, weight_level sequence (the paper's theory);
                 reference: the exact gradient of -(E_theta[R] - beta URKL), by enumeration (the
                 expected gradient under pi_old equals it, tests/test_core_exact.py).
For each mismatch size and correction: relative L2 error |E g - g_ref| / |g_ref|, cosine(E g, g_ref),
the one-sample gradient's variance (trace of its covariance, exact) relative to the reference's
under pi_old, and the expected filtered fraction of the units (tokens or sequences) under mu.
Exact expectations show the bias only; with 3 tokens per sequence the variance of the exact
sequence weight pi_old(x)/mu(x) stays small, where at thousands of tokens it grows exponentially.

    .venv/bin/python bench/rollout_correction.py [--json bench/results/rollout_correction.json]
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import torch
from benchlib import REPO, environment, write_json
from exact_gradients import BETA, SEQS, V, divergence, token_logp

F64 = torch.float64
N_PREFIX = sum(V**t for t in range(SEQS.shape[1]))
DELTAS = (0.1, 0.3, 0.6)
BANDS = ((0.5, 5.0), (0.8, 1.25), (0.9, 1.1))
PAPER = dict(eps_low=0.2, eps_high=0.28, clip_c=10.0)
WIDE = dict(eps_low=1.0, eps_high=1e3, clip_c=1e4)


def corrections() -> dict[str, Any]:
    from rpg_openrlhf.core import RolloutCorrection

    out = {
        "none": RolloutCorrection(),
        "token, untruncated": RolloutCorrection.untruncated("token"),
        "seq, untruncated": RolloutCorrection.untruncated("seq"),
    }
    for lo, hi in BANDS:
        out[f"token mask [{lo}, {hi}]"] = RolloutCorrection("token", "mask", low=lo, high=hi)
        out[f"token clip [{lo}, {hi}]"] = RolloutCorrection("token", "clip", low=lo, high=hi)
        out[f"seq mask [{lo}, {hi}]"] = RolloutCorrection("seq", "mask", low=lo, high=hi)
    return out


def gradient_moments(
    theta, old, sampler, reward, correction, weight_level: str, cfg: dict
) -> tuple[torch.Tensor, float]:
    """(E[g], E|g - E[g]|^2) of the one-sample gradient g(x) = grad L(x), x ~ sampler, exactly
    (L(x): the per-sample loss, its tokens summed)."""
    from rpg_openrlhf.core import LossConfig, token_losses

    th = theta.clone().requires_grad_()
    old_logp, mu_logp = token_logp(old), token_logp(sampler)
    config = LossConfig(beta=BETA, weight_level=weight_level, rollout_correction=correction, **cfg)
    loss, mask, _ = token_losses("urkl", "reinforce_clip", token_logp(th), old_logp, reward,
                                 config=config, rollout_logp=mu_logp)  # fmt: skip
    per_sample = (loss * mask).sum(-1)
    grads = torch.stack([torch.autograd.grad(v, th, retain_graph=True)[0] for v in per_sample])
    p = mu_logp.sum(-1).exp()
    mean = torch.einsum("n,n...->...", p, grads)
    return mean, (p * (grads - mean).pow(2).flatten(1).sum(-1)).sum().item()


def filtered_fraction(old, mu, correction) -> float:
    """E_mu of the filtered fraction of a sample's units (its tokens, or the sequence)."""
    from rpg_openrlhf.core import rollout_weight

    if not correction.enabled:
        return 0.0
    old_logp, mu_logp = token_logp(old), token_logp(mu)
    mask = torch.ones_like(old_logp, dtype=torch.bool)
    _, filtered = rollout_weight(old_logp, mu_logp, mask, correction, 20.0)
    return (mu_logp.sum(-1).exp() * filtered.to(F64).mean(-1)).sum().item()


def exact_grad(theta, ref, reward) -> torch.Tensor:
    th = theta.clone().requires_grad_()
    logp = token_logp(th).sum(-1)
    objective = (logp.exp() * reward).sum() - BETA * divergence("urkl", logp, token_logp(ref).sum(-1))
    return torch.autograd.grad(-objective, th)[0]


def compare(g: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    rel = ((g - ref).norm() / ref.norm()).item()
    cos = (torch.dot(g.flatten(), ref.flatten()) / (g.norm() * ref.norm())).item()
    return rel, cos


def mismatch_stats(old, mu) -> dict[str, float]:
    """Per-token KL(mu || pi_old) under mu (what vllm_kl estimates) and the range of pi_old(x)/mu(x)."""
    old_logp, mu_logp = token_logp(old), token_logp(mu)
    p_mu = mu_logp.sum(-1).exp()
    log_c = (old_logp - mu_logp).sum(-1)
    return {
        "kl_per_token": (p_mu * (mu_logp - old_logp).sum(-1)).sum().item() / old_logp.shape[1],
        "seq_weight_min": log_c.exp().min().item(),
        "seq_weight_max": log_c.exp().max().item(),
    }


def run_delta(delta, theta, old, direction, reward) -> tuple[dict[str, float], list[dict[str, Any]]]:
    mu = old + delta * direction
    none = corrections()["none"]
    ref_token, var_token = gradient_moments(theta, old, old, reward, none, "token", PAPER)
    ref_seq, var_seq = (
        exact_grad(theta, old, reward),
        gradient_moments(theta, old, old, reward, none, "sequence", WIDE)[1],
    )
    rows = []
    for label, corr in corrections().items():
        row: dict[str, Any] = {"delta": delta, "correction": label}
        mean, var = gradient_moments(theta, old, mu, reward, corr, "token", PAPER)
        rel, cos = compare(mean, ref_token)
        row.update(token_rel_err=rel, token_cos=cos, token_var=var / var_token)
        if corr.level != "token":  # token-level correction needs token-level weights
            mean, var = gradient_moments(theta, old, mu, reward, corr, "sequence", WIDE)
            rel, cos = compare(mean, ref_seq)
            row.update(seq_rel_err=rel, seq_cos=cos, seq_var=var / var_seq)
        row["filtered"] = filtered_fraction(old, mu, corr)
        rows.append(row)
    return mismatch_stats(old, mu), rows


def fmt(rows: list[dict[str, Any]]) -> str:
    def num(v: float | None, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    head = (f"{'correction':<24} {'tok rel.err':>11} {'tok cos':>8} {'tok var':>7} "
            f"{'seq rel.err':>11} {'seq cos':>8} {'seq var':>7} {'filtered':>8}")  # fmt: skip
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['correction']:<24} {num(r['token_rel_err'], '.2e'):>11} {num(r['token_cos'], '.4f'):>8} "
            f"{num(r['token_var'], '.3f'):>7} {num(r.get('seq_rel_err'), '.2e'):>11} "
            f"{num(r.get('seq_cos'), '.4f'):>8} {num(r.get('seq_var'), '.3f'):>7} {r['filtered']:>8.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deltas", type=float, nargs="+", default=list(DELTAS))
    p.add_argument("--json", default=None, help="write results to this file")
    args = p.parse_args(argv)
    g = torch.Generator().manual_seed(args.seed)
    old = 0.8 * torch.randn(N_PREFIX, V, generator=g, dtype=F64)
    theta = old + 0.4 * torch.randn(N_PREFIX, V, generator=g, dtype=F64)
    reward = torch.randn(len(SEQS), generator=g, dtype=F64)
    reward = reward - reward.mean()  # a constant baseline
    direction = torch.randn(N_PREFIX, V, generator=g, dtype=F64)

    print(
        f"rollout mismatch on the enumerable policy (27 sequences, float64, urkl/reinforce_clip, beta {BETA},"
    )
    print(f"pi_ref = pi_old, seed {args.seed}): expected gradient under mu vs the reference (see --help)")
    results = []
    for delta in args.deltas:
        stats, rows = run_delta(delta, theta, old, direction, reward)
        print(
            f"\nmu = pi_old logits + {delta} x N(0,1): KL(mu || pi_old) per token {stats['kl_per_token']:.2e}, "
            f"pi_old(x)/mu(x) in [{stats['seq_weight_min']:.3f}, {stats['seq_weight_max']:.3f}]"
        )
        print(fmt(rows))
        results.append({"delta": delta, **stats, "rows": rows})
    print(
        "\ntok: token weights, paper windows (reference: the same loss under pi_old); seq: sequence weights,"
        "\nwide windows (reference: the exact gradient); var: trace of the one-sample gradient's covariance"
        "\nunder mu / that of the reference under pi_old; filtered: E_mu of the filtered fraction of units"
    )
    assert all(math.isfinite(r["token_rel_err"]) for res in results for r in res["rows"])
    result = {"args": vars(args), "env": environment(), "results": results}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
