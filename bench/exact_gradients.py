"""Print the exact-gradient errors of every RPG loss (the figures README.md and docs/losses.md quote).

The policy of tests/test_core_exact.py: vocabulary 3, length 3 (27 sequences), tabular logits per
prefix, float64. For every divergence x style (nothing clipped: wide windows), off- and on-policy,
pi_ref = pi_old and not, with and without a baseline, the gradient of E_old[L] (sequence-level
weights, the expectation an exact pi_old-weighted sum over the 27 sequences) is compared with the
autograd gradient of the exact objective -(E_theta[R] - beta D(pi_theta, pi_ref)), D enumerated
from the probabilities. Also GRPO's k3 term (matches none of the four off-policy, FKL on-policy)
and corrected GRPO (URKL).

    .venv/bin/python bench/exact_gradients.py [--json bench/results/exact_gradients.json]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any

import torch
from benchlib import REPO, environment, fmt_table, write_json

F64 = torch.float64
V, L = 3, 3
SEQS = torch.tensor(list(itertools.product(range(V), repeat=L)))
BETA = 0.3
DIVS = ("fkl", "rkl", "ufkl", "urkl")
WIDE = dict(eps_low=1.0, eps_high=1e3, clip_c=1e4)
STYLES = {
    "differentiable (-w A)": ("differentiable", dict(clip_reward=False)),
    "differentiable (PPO, wide)": ("differentiable", WIDE),
    "reinforce": ("reinforce", {}),
    "reinforce_clip (wide)": ("reinforce_clip", WIDE),
}


def prefix_index() -> torch.Tensor:
    idx, offset = torch.zeros_like(SEQS), 0
    for t in range(L):
        code = torch.zeros(len(SEQS), dtype=torch.long)
        for s in range(t):
            code = code * V + SEQS[:, s]
        idx[:, t] = offset + code
        offset += V**t
    return idx


PREFIX = prefix_index()


def token_logp(theta: torch.Tensor) -> torch.Tensor:
    return theta[PREFIX].log_softmax(-1).gather(-1, SEQS.unsqueeze(-1)).squeeze(-1)


def divergence(name: str, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    p, q = logp.exp(), logq.exp()
    return {
        "fkl": (q * (logq - logp)).sum(),
        "rkl": (p * (logp - logq)).sum(),
        "ufkl": (q * (logq - logp) - q + p).sum(),
        "urkl": (p * (logp - logq) - p + q).sum(),
    }[name]


def exact_grad(name: str, theta: torch.Tensor, ref: torch.Tensor, reward: torch.Tensor) -> torch.Tensor:
    th = theta.clone().requires_grad_()
    logp = token_logp(th).sum(-1)
    objective = (logp.exp() * reward).sum() - BETA * divergence(name, logp, token_logp(ref).sum(-1))
    return torch.autograd.grad(-objective, th)[0]


def surrogate_grad(name, style, theta, old, ref, adv, cfg) -> torch.Tensor:
    from rpg_openrlhf.core import LossConfig, token_losses

    th = theta.clone().requires_grad_()
    old_logp = token_logp(old)
    ref_logp = None if ref is None else token_logp(ref)
    config = LossConfig(beta=BETA, weight_level="sequence", **cfg)
    loss, _, _ = token_losses(name, style, token_logp(th), old_logp, adv, None, ref_logp, config)
    return torch.autograd.grad((old_logp.sum(-1).exp() * loss.squeeze(-1)).sum(), th)[0]


def clamp_thresholds(k: float = 10.0) -> dict[str, list[float]]:
    """Where the released code's KL clamp at k starts (pi_ref = pi_old): the w at which the per-token
    value D_t(w) of each divergence (the core's formulas; GRPO: k3(1/w)) crosses k, by bisection
    on log w in [-20, 20] (the log-ratio clamp)."""
    from rpg_openrlhf.core import DIVERGENCES

    def value(name: str, log_w: float) -> float:
        lw = torch.tensor(log_w, dtype=F64)
        if name == "grpo_kl":
            return (torch.expm1(-lw) + lw).item()  # k3(pi_ref/pi_theta) = 1/w - 1 + log w
        return DIVERGENCES[name].value(lw, lw.exp(), 1.0).item()

    out: dict[str, list[float]] = {}
    grid = torch.linspace(-20, 20, 4001, dtype=F64).tolist()
    for name in (*DIVS, "grpo_kl"):
        crossings = []
        for level in (k, -k):
            for a, b in zip(grid, grid[1:]):
                fa, fb = value(name, a) - level, value(name, b) - level
                if (fa > 0) != (fb > 0):
                    for _ in range(60):
                        m = (a + b) / 2
                        if (value(name, m) - level > 0) == (fa > 0):
                            a = m
                        else:
                            b = m
                    crossings.append(float(torch.tensor((a + b) / 2, dtype=F64).exp()))
        out[name] = sorted(crossings)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write results to this file")
    args = p.parse_args(argv)
    g = torch.Generator().manual_seed(args.seed)
    n_prefix = sum(V**t for t in range(L))
    old = 0.8 * torch.randn(n_prefix, V, generator=g, dtype=F64)
    theta = old + 0.4 * torch.randn(n_prefix, V, generator=g, dtype=F64)
    other_ref = old + 0.4 * torch.randn(n_prefix, V, generator=g, dtype=F64)
    reward = torch.randn(len(SEQS), generator=g, dtype=F64)

    rows, cases = [], []
    for name, (label, (style, cfg)) in itertools.product(DIVS, STYLES.items()):
        errors = []
        for policy, ref_kind, baseline in itertools.product(("off", "on"), ("old", "other"), (0.0, 0.7)):
            th = theta if policy == "off" else old
            ref = other_ref if ref_kind == "other" else old
            got = surrogate_grad(
                name, style, th, old, None if ref_kind == "old" else ref, reward - baseline, cfg
            )
            want = exact_grad(name, th, ref, reward)
            err = (got - want).abs().max().item()
            errors.append(err)
            cases.append({"loss": name, "style": label, "policy": policy, "ref": ref_kind, "baseline": baseline,
                          "max_abs_error": err, "grad_norm": want.norm().item()})  # fmt: skip
        rows.append({"loss": name, "style": label, "cases": len(errors), "max_abs_error": max(errors)})

    grpo = {}
    for ref_kind in ("old", "other"):
        ref = other_ref if ref_kind == "other" else old
        r = None if ref_kind == "old" else ref
        off = surrogate_grad("grpo_kl", "differentiable", theta, old, r, reward, WIDE)
        grpo[f"grpo_kl off-policy, ref={ref_kind}: min over D of max |grad - grad_D|"] = min(
            (off - exact_grad(d, theta, ref, reward)).abs().max().item() for d in DIVS
        )
        corrected = surrogate_grad("grpo_kl_corrected", "differentiable", theta, old, r, reward, WIDE)
        grpo[f"grpo_kl_corrected off-policy, ref={ref_kind}: max |grad - grad_URKL|"] = (
            (corrected - exact_grad("urkl", theta, ref, reward)).abs().max().item()
        )
    on = surrogate_grad("grpo_kl", "differentiable", old, old, other_ref, reward, WIDE)
    grpo["grpo_kl on-policy: max |grad - grad_FKL|"] = (
        (on - exact_grad("fkl", old, other_ref, reward)).abs().max().item()
    )

    worst = max(r["max_abs_error"] for r in rows)
    print(f"exact gradients on the enumerable policy (27 sequences, float64, beta {BETA}, seed {args.seed}):")
    print(fmt_table([{**r, "max_abs_error": f"{r['max_abs_error']:.1e}"} for r in rows],
                    ["loss", "style", "cases", "max_abs_error"]))  # fmt: skip
    print(
        f"all {len(cases)} cases (off/on-policy x pi_ref = pi_old or not x baseline 0/0.7): max error {worst:.1e}"
    )
    for key, value in grpo.items():
        print(f"{key}: {value:.1e}")
    thresholds = clamp_thresholds()
    print("released KL clamp at 10 (pi_ref = pi_old): |D_t| = 10 at w =")
    for name, ws in thresholds.items():
        print(f"  {name}: {', '.join(f'{w:.4g}' for w in ws) or 'never for |log w| <= 20'}")
    result = {"args": vars(args), "env": environment(), "max_abs_error": worst, "rows": rows, "cases": cases,
              "grpo": grpo, "released_kl_clamp_thresholds_w": thresholds}  # fmt: skip
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
