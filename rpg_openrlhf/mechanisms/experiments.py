"""The four mechanism experiments of issue #7 on the enumerable toy policy (see ``toy.py``).

Every loss comes from ``rpg_openrlhf.core`` (token_losses / compute_loss); this module only
(a) takes exact expectations of those per-sample losses by enumerating all sequences weighted
by pi_old, and (b) trains the tabular policy on sampled mini-batches with them.
Each ``exp*`` function returns plain rows (list of dicts) that ``report.py`` turns into tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from rpg_openrlhf.core import LossConfig, ReferenceSchedule, compute_loss, group_advantages, token_losses

from . import toy as T

RPG_NAMES = ("fkl", "rkl", "ufkl", "urkl")
# The divergence each loss regularizes (what its KL term is meant to estimate): GRPO's k3 term
# is meant as the reverse KL; the corrected term is exactly the unnormalized reverse KL.
TARGET = {**{n: n for n in RPG_NAMES}, "grpo_kl": "rkl", "grpo_kl_corrected": "urkl"}
# Divergence family whose optimum is the on-policy fixed point (see fixed_point()).
FIXED_POINT_FAMILY = {"fkl": "fkl", "ufkl": "fkl", "grpo_kl": "fkl", "rkl": "rkl", "urkl": "rkl",
                      "grpo_kl_corrected": "rkl"}  # fmt: skip
#: every loss of experiments 1 and 2: GRPO's k3 term, the corrected one, 4 RPG x {differentiable, reinforce}
METHODS = [("grpo_kl", "differentiable"), ("grpo_kl_corrected", "differentiable")] + [
    (n, s) for n in RPG_NAMES for s in ("differentiable", "reinforce")
]


# ----------------------------------------------------------------------------------------
# Exact expectations of core losses.


def exact_loss(
    toy: T.Toy, name: str, style: str, logits: Tensor, old_logits: Tensor, adv: Tensor, ref_logits, config
) -> Tensor:
    """E_{x ~ pi_old}[ sum over the entries of one sample of the core per-sample loss ].

    Sums over tokens (token-level weights) or the one sequence entry (sequence-level weights),
    weighting each of the N sequences by pi_old(x): exact, no sampling. ``adv`` (the advantages) is
    [N]; ``ref_logits`` None: pi_ref = pi_old; ``config``: the core's LossConfig.
    """
    logp = T.token_logp(toy, logits)
    old = T.token_logp(toy, old_logits).detach()
    ref = None if ref_logits is None else T.token_logp(toy, ref_logits).detach()
    loss, mask, _ = token_losses(name, style, logp, old, adv, None, ref, config)
    weight = old.sum(-1).exp()
    return (weight[:, None] * loss * mask).sum()


def grad_of(fn, logits: Tensor) -> Tensor:
    """Gradient of the scalar fn(logits) w.r.t. the logit table (a fresh leaf)."""
    x = logits.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(x), x)
    return g


def exact_grad(
    toy: T.Toy, name: str, style: str, theta: Tensor, old: Tensor, adv: Tensor, ref, cfg
) -> Tensor:
    """Gradient of exact_loss w.r.t. the logit table at ``theta``."""
    return grad_of(lambda x: exact_loss(toy, name, style, x, old, adv, ref, cfg), theta)


def true_divergence_grad(
    toy: T.Toy, div: str, level: str, logits: Tensor, old_logits: Tensor, ref_logits: Tensor
) -> Tensor:
    """Exact gradient of the divergence a surrogate should follow.

    sequence: D(pi_theta, pi_ref) over whole sequences.
    token: sum over prefixes h of pi_old(h) * D(pi_theta(.|h), pi_ref(.|h)) -- what per-token
    weights estimate when the prefixes are drawn from pi_old (the prefix weights carry no gradient).
    """
    ref_lp = T.seq_logp(toy, ref_logits).detach()
    if level == "sequence":
        return grad_of(lambda x: T.divergence(div, T.seq_logp(toy, x), ref_lp), logits)
    w = T.prefix_probs(toy, old_logits)
    return grad_of(lambda x: T.prefix_divergence(div, toy, x, ref_logits.detach(), w), logits)


def _rel(err: Tensor, ref: Tensor) -> float:
    n = float(ref.norm())
    return float(err.norm()) / n if n > 1e-12 else math.nan  # ref = old at s = 0: grad D = 0


def exp1_kl_gradient_bias(toy: T.Toy, drifts: list[float], seed: int = 0) -> list[dict]:
    """Exact gradient error of the KL terms as pi_theta drifts away from pi_old.

    pi_old = random policy (seed); pi_theta = pi_old + s * (random direction); two references:
    ``ref=old`` (the paper's iterative reference) and ``ref=fixed`` (a third random policy).
    Reward is switched off (A = 0, beta = 1), so the loss is the KL term alone. For each loss
    and each of the four divergences the row holds ||E_old[grad L] - grad D|| (absolute and
    relative to ||grad D||), with exact expectations at both weight levels.
    """
    g = torch.Generator().manual_seed(seed + 1000)
    old = T.init_logits(toy, seed)
    direction = torch.randn(old.shape, generator=g, dtype=T.DTYPE)
    fixed_ref = old + 0.5 * torch.randn(old.shape, generator=g, dtype=T.DTYPE)
    zero_adv = torch.zeros(toy.num_seqs, dtype=T.DTYPE)
    rows = []
    for ref_name, ref in (("old", None), ("fixed", fixed_ref)):
        ref_logits = old if ref is None else ref
        for level in ("sequence", "token"):
            cfg = LossConfig(beta=1.0, weight_level=level, clip_reward=False)
            for s in drifts:
                theta = old + s * direction
                kl_old_theta = float(T.kl(T.seq_logp(toy, old), T.seq_logp(toy, theta)))
                true = {d: true_divergence_grad(toy, d, level, theta, old, ref_logits) for d in RPG_NAMES}
                for name, style in METHODS:
                    est = exact_grad(toy, name, style, theta, old, zero_adv, ref, cfg)
                    for d in RPG_NAMES:
                        if name in RPG_NAMES and d != name:
                            continue  # an RPG loss is only compared with its own divergence
                        err = est - true[d]
                        rows.append({"ref": ref_name, "level": level, "drift_s": s, "kl_old_theta": kl_old_theta,
                                     "loss": name, "style": style, "divergence": d,
                                     "abs_error": float(err.norm()), "rel_error": _rel(err, true[d]),
                                     "true_grad_norm": float(true[d].norm())})  # fmt: skip
    return rows


# ----------------------------------------------------------------------------------------
# Training on sampled mini-batches.


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Sizes: ``groups`` x ``group_size`` samples per rollout, split into
    mini-batches of ``minibatch`` samples, ``epochs`` passes per rollout (so several optimizer
    steps per rollout: the later ones are off-policy)."""

    name: str = "rkl"
    style: str = "differentiable"
    loss: LossConfig = field(default_factory=lambda: LossConfig(beta=0.25))
    rollouts: int = 150
    groups: int = 32
    group_size: int = 8
    minibatch: int = 64
    epochs: int = 2
    lr: float = 0.05
    lr_final_frac: float = 0.01  # cosine decay to lr * lr_final_frac: lets runs settle
    # Leave-one-out: the paper's group mean (A = R - mean incl. the sample itself) scales the
    # expected reward gradient by (n-1)/n, i.e. trains with beta * n/(n-1) (see exp2_baseline).
    baseline: str = "loo"
    ref_mode: str = "initial"
    ref_k: int | None = None
    ref_kappa: float | None = None
    init_seed: int = 0
    seed: int = 0


@dataclass
class TrainResult:
    logits: Tensor
    init_logits: Tensor
    history: list[dict]
    refreshes: list[int]


def cosine_lr(lr: float, final: float, angle: float) -> float:
    """The learning rate on a half cosine from lr (angle 0) down to lr * final (angle pi)."""
    return lr * (final + (1 - final) * 0.5 * (1 + math.cos(angle)))


def train(toy: T.Toy, cfg: TrainConfig) -> TrainResult:
    """Train the tabular policy with core.compute_loss on sampled mini-batches (Adam).

    The reference follows ``core.ReferenceSchedule(cfg.ref_mode)``; mode 'rollout' passes
    ref_logp=None (pi_ref = pi_old). History: one row per rollout with exact expected reward and
    exact KL(pi_theta || pi_init).
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    init = T.init_logits(toy, cfg.init_seed)
    theta = init.clone().requires_grad_(True)
    ref = init.clone()
    opt = torch.optim.Adam([theta], lr=cfg.lr)
    sched = ReferenceSchedule(cfg.ref_mode, k=cfg.ref_k, kappa=cfg.ref_kappa)
    total_steps = cfg.rollouts * cfg.epochs * math.ceil(cfg.groups * cfg.group_size / cfg.minibatch)
    init_lp = T.seq_logp(toy, init)
    history, step = [], 0
    for r in range(cfg.rollouts):
        old = theta.detach().clone()
        ids = T.sample(toy, old, cfg.groups * cfg.group_size, gen)
        adv = group_advantages(toy.reward[ids], cfg.group_size, cfg.baseline)
        old_lp = T.token_logp(toy, old, ids)
        for _ in range(cfg.epochs):
            perm = torch.randperm(ids.numel(), generator=gen)
            for mb in perm.split(cfg.minibatch):
                frac = step / max(total_steps - 1, 1)
                for group in opt.param_groups:  # set before the step
                    group["lr"] = cosine_lr(cfg.lr, cfg.lr_final_frac, math.pi * frac)
                ref_lp = None if sched.uses_old_policy else T.token_logp(toy, ref, ids[mb])
                logp = T.token_logp(toy, theta, ids[mb])
                loss, m = compute_loss(cfg.name, cfg.style, logp, old_lp[mb], adv[mb], None, ref_lp, cfg.loss)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                if sched.observe(m["kl"]):
                    ref = theta.detach().clone()
        with torch.no_grad():
            lp = T.seq_logp(toy, theta)
            history.append({"rollout": r + 1, "step": step, "reward": float(T.expected_reward(toy, lp)),
                            "kl_from_init": float(T.kl(lp, init_lp))})  # fmt: skip
    return TrainResult(theta.detach(), init, history, list(sched.refreshes))


def fixed_point(
    toy: T.Toy, family: str, level: str, beta: float, init_seed=0, steps=3000, lr=0.05, style="differentiable"
) -> tuple[Tensor, float]:
    """The point where the method's exact *on-policy* expected update vanishes.

    Found by deterministic Adam on the exact expectation (pi_old = the current pi_theta, the
    advantage A = R - E[R]) of the core loss ``family`` in ``style``, pi_ref = initial policy.
    On-policy, fkl / ufkl / grpo_kl share one expected gradient and rkl / urkl / grpo_kl_corrected
    another, so two families cover all losses. At sequence level the answer is the analytic
    optimum (checked by the tests); at token level it is not (per-token weights drop the
    KL of later tokens from the credit of earlier ones). Returns (log pi [N], final grad norm).
    """
    init = T.init_logits(toy, init_seed)
    theta = init.clone().requires_grad_(True)
    cfg = LossConfig(beta=beta, weight_level=level, clip_reward=False)
    opt = torch.optim.Adam([theta], lr=lr)
    gnorm = math.nan
    for i in range(steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(lr, 0.01, math.pi * i / steps)
        with torch.no_grad():
            p = T.seq_logp(toy, theta).exp()
            adv = toy.reward - (p * toy.reward).sum()
        loss = exact_loss(toy, family, style, theta, theta.detach(), adv, init, cfg)
        opt.zero_grad()
        loss.backward()
        gnorm = float(theta.grad.norm())
        opt.step()
    return T.seq_logp(toy, theta.detach()), gnorm


def optima(toy: T.Toy, init_seed: int, beta: float) -> tuple[Tensor, dict[str, Tensor]]:
    """(log pi_init, {"rkl": log pi*_RKL, "fkl": log pi*_FKL}) for pi_ref = pi_init."""
    init_lp = T.seq_logp(toy, T.init_logits(toy, init_seed))
    return init_lp, {"rkl": T.rkl_optimum(toy, init_lp, beta), "fkl": T.fkl_optimum(toy, init_lp, beta)}


def _point(toy: T.Toy, point: str, level: str, lp: Tensor, opt: dict, init_lp: Tensor, gn: float) -> dict:
    """One reference point of exp2: its reward, distances to both optima and KL from pi_init."""
    return {"point": point, "level": level, "reward": float(T.expected_reward(toy, lp)),
            "tv_rkl_opt": float(T.tv(lp, opt["rkl"])), "tv_fkl_opt": float(T.tv(lp, opt["fkl"])),
            "kl_from_init": float(T.kl(lp, init_lp)), "grad_norm": gn}  # fmt: skip


def run_metrics(toy: T.Toy, res: TrainResult, opt: dict[str, Tensor], fp: Tensor) -> dict:
    """Exact end-of-run quantities: distances to the optima and to the fixed point, reward, KL."""
    lp = T.seq_logp(toy, res.logits)
    return {
        "reward": float(T.expected_reward(toy, lp)),
        "tv_rkl_opt": float(T.tv(lp, opt["rkl"])),
        "tv_fkl_opt": float(T.tv(lp, opt["fkl"])),
        "kl_rkl_opt": float(T.kl(lp, opt["rkl"])),
        "kl_fkl_opt": float(T.kl(lp, opt["fkl"])),
        "tv_fixed_point": float(T.tv(lp, fp)),
        "kl_from_init": float(T.kl(lp, T.seq_logp(toy, res.init_logits))),
    }


def exp2_where_training_ends(
    toy: T.Toy, base: TrainConfig, seeds: list[int], levels=("sequence", "token"), fixed_point_steps=3000
) -> tuple[list[dict], list[dict]]:
    """Train every loss (GRPO, corrected GRPO, 4 RPG x {differentiable, reinforce}) at each
    weight level with a fixed reference (pi_ref = initial policy); rows per run, plus the
    reference points (optima and fixed points)."""
    beta = base.loss.beta
    init_lp, opt = optima(toy, base.init_seed, beta)
    refs = [_point(toy, f"{k}_optimum", "exact", v, opt, init_lp, 0.0) for k, v in opt.items()]
    fps = {}
    for level in levels:
        for fam in ("fkl", "rkl"):
            fp, gn = fixed_point(toy, fam, level, beta, base.init_seed, steps=fixed_point_steps)
            fps[(level, fam)] = fp
            refs.append(_point(toy, f"{fam}_fixed_point", level, fp, opt, init_lp, gn))
    rows = []
    for level in levels:
        for name, style in METHODS:
            for seed in seeds:
                cfg = replace(
                    base, name=name, style=style, seed=seed, loss=replace(base.loss, weight_level=level)
                )
                res = train(toy, cfg)
                m = run_metrics(toy, res, opt, fps[(level, FIXED_POINT_FAMILY[name])])
                rows.append({"level": level, "loss": name, "style": style, "seed": seed,
                             "target": TARGET[name], **m})  # fmt: skip
    return rows, refs


def exp2_baseline(toy: T.Toy, base: TrainConfig, seeds: list[int]) -> list[dict]:
    """RKL (sequence level) trained with the group-mean baseline vs leave-one-out.

    With A = R - mean_j R the sample's own reward sits in its baseline, so E[A grad log pi] =
    (n-1)/n grad E[R]: the run targets the optimum for beta * n/(n-1), not for beta.
    """
    beta, n = base.loss.beta, base.group_size
    init_lp, opt = optima(toy, base.init_seed, beta)
    opt = opt["rkl"]
    opt_eff = T.rkl_optimum(toy, init_lp, beta * n / (n - 1))
    rows = []
    for baseline in ("loo", "mean"):
        for seed in seeds:
            cfg = replace(base, name="rkl", style="differentiable", baseline=baseline, seed=seed,
                          loss=replace(base.loss, weight_level="sequence"))  # fmt: skip
            lp = T.seq_logp(toy, train(toy, cfg).logits)
            rows.append({"baseline": baseline, "seed": seed, "group_size": n, "reward": float(T.expected_reward(toy, lp)),
                         "tv_opt_beta": float(T.tv(lp, opt)), "tv_opt_beta_eff": float(T.tv(lp, opt_eff)),
                         "opt_reward_beta": float(T.expected_reward(toy, opt)),
                         "opt_reward_beta_eff": float(T.expected_reward(toy, opt_eff))})  # fmt: skip
    return rows


# ----------------------------------------------------------------------------------------
# RPG-Style Clip.

CLIP_SETTINGS: tuple[tuple[str, float | None, float | None, float | None], ...] = (
    # (label, eps_low, eps_high, c); eps None = no clipping (the plain REINFORCE-style loss)
    ("none", None, None, None),
    ("0.1/0.1", 0.1, 0.1, None),
    ("0.1/0.1 c=3", 0.1, 0.1, 3.0),
    ("0.1/0.1 c=10", 0.1, 0.1, 10.0),
    ("0.2/0.28", 0.2, 0.28, None),
    ("0.2/0.28 c=3", 0.2, 0.28, 3.0),
    ("0.2/0.28 c=10", 0.2, 0.28, 10.0),
)


def clip_style(base: LossConfig, eps_low: float | None, eps_high: float | None, c: float | None):
    """(style, LossConfig) for one clip setting: no eps = the unclipped REINFORCE-style loss."""
    if eps_low is None:
        return "reinforce", base
    return "reinforce_clip", replace(base, eps_low=eps_low, eps_high=eps_high, clip_c=c)


def exp3_clip_variance(
    toy: T.Toy, name: str, beta: float, drifts: list, n_batches: int, groups: int, group_size: int, seed=0
) -> list[dict]:
    """Sampled-gradient statistics of RPG-Style Clip as pi_theta drifts from the behaviour policy.

    pi_old = pi_ref = initial policy, pi_theta = pi_old + s * direction. For each setting, draw
    ``n_batches`` batches from pi_old (leave-one-out advantages, token-level weights, token-mean),
    and report the total variance tr Cov(g) of the batch gradient and the distance of its mean
    from the exact expected gradient of the *unclipped* REINFORCE-style loss (exact baseline
    E_old[R]), i.e. the bias the clip trades for the variance. Batches are shared by settings.
    """
    g = torch.Generator().manual_seed(seed + 2000)
    old = T.init_logits(toy, seed)
    direction = torch.randn(old.shape, generator=g, dtype=T.DTYPE)
    base = LossConfig(beta=beta, weight_level="token")
    p_old = T.seq_logp(toy, old).exp()
    exact_adv = toy.reward - (p_old * toy.reward).sum()
    rows = []
    for s in drifts:
        theta = old + s * direction
        kl_old_theta = float(T.kl(T.seq_logp(toy, old), T.seq_logp(toy, theta)))
        # Per-token mean over L tokens, to match the token-mean aggregation of the batches.
        ref_grad = exact_grad(toy, name, "reinforce", theta, old, exact_adv, old, base) / toy.length
        batches = []
        for _ in range(n_batches):
            ids = T.sample(toy, old, groups * group_size, g)
            batches.append((ids, group_advantages(toy.reward[ids], group_size, "loo")))
        old_tok = T.token_logp(toy, old)
        for label, el, eh, c in CLIP_SETTINGS:
            style, cfg = clip_style(base, el, eh, c)
            grads, clipped = [], []
            for ids, adv in batches:
                x = theta.clone().requires_grad_(True)
                loss, met = compute_loss(name, style, T.token_logp(toy, x, ids), old_tok[ids], adv, None,
                                         old_tok[ids], cfg)  # fmt: skip
                (gr,) = torch.autograd.grad(loss, x)
                grads.append(gr.reshape(-1))
                clipped.append(met["clip_frac_low"] + met["clip_frac_high"] + met["clip_frac_dual"])
            G = torch.stack(grads)
            mean = G.mean(0)
            var = float(((G - mean) ** 2).sum(-1).mean())
            bias = float((mean - ref_grad.reshape(-1)).norm())
            rows.append({"drift_s": s, "kl_old_theta": kl_old_theta, "setting": label, "eps_low": el,
                         "eps_high": eh, "clip_c": c, "grad_variance": var, "bias": bias,
                         "rel_bias": bias / float(ref_grad.norm()), "rel_variance": var / float(ref_grad.norm()) ** 2,
                         "mean_grad_norm": float(mean.norm()),
                         "ref_grad_norm": float(ref_grad.norm()), "clip_frac": sum(clipped) / len(clipped)})  # fmt: skip
    return rows


def exp3_clip_training(toy: T.Toy, base: TrainConfig, epochs_list: list[int], seeds: list[int]) -> list[dict]:
    """Final exact reward and distance to pi* for each clip setting; drift is set by the number
    of passes over each rollout (more epochs = more optimizer steps away from pi_old)."""
    _, opt = optima(toy, base.init_seed, base.loss.beta)
    rows = []
    for epochs in epochs_list:
        for label, el, eh, c in CLIP_SETTINGS:
            style, lcfg = clip_style(replace(base.loss, weight_level="token"), el, eh, c)
            for seed in seeds:
                cfg = replace(base, style=style, loss=lcfg, epochs=epochs, seed=seed)
                res = train(toy, cfg)
                lp = T.seq_logp(toy, res.logits)
                max_kl = max(h["kl_from_init"] for h in res.history)
                rows.append({"epochs": epochs, "setting": label, "seed": seed, "loss": base.name,
                             "reward": float(T.expected_reward(toy, lp)), "tv_rkl_opt": float(T.tv(lp, opt["rkl"])),
                             "max_kl_from_init": max_kl})  # fmt: skip
    return rows


# ----------------------------------------------------------------------------------------
# Iterative reference.

REF_SCHEDULES: tuple[tuple[str, str, int | None, float | None], ...] = (
    ("fixed (initial)", "initial", None, None),
    ("every K=64 steps", "every_k", 64, None),
    ("KL > kappa=0.02", "kl_threshold", None, 0.02),
    ("every rollout", "rollout", None, None),
)


def exp4_reference(toy: T.Toy, base: TrainConfig, seeds: list[int]) -> tuple[list[dict], list[dict]]:
    """Reward vs KL from the initial policy under each reference schedule (trajectories + finals)."""
    traj, finals = [], []
    for label, mode, k, kappa in REF_SCHEDULES:
        for seed in seeds:
            cfg = replace(base, ref_mode=mode, ref_k=k, ref_kappa=kappa, seed=seed)
            res = train(toy, cfg)
            for h in res.history:
                traj.append({"schedule": label, "seed": seed, **h})
            finals.append({"schedule": label, "seed": seed, "reward": res.history[-1]["reward"],
                           "kl_from_init": res.history[-1]["kl_from_init"], "refreshes": len(res.refreshes)})  # fmt: skip
    return traj, finals


def exp4_frontier(toy: T.Toy, init_seed: int, betas: list[float]) -> list[dict]:
    """The best achievable (KL from pi_init, reward) pairs: the RKL optima pi_init exp(R/b) over b."""
    init_lp = T.seq_logp(toy, T.init_logits(toy, init_seed))
    rows = []
    for b in betas:
        lp = T.rkl_optimum(toy, init_lp, b)
        kl, reward = float(T.kl(lp, init_lp)), float(T.expected_reward(toy, lp))
        rows.append({"beta": b, "kl_from_init": kl, "reward": reward})
    return rows
