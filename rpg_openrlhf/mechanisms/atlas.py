"""Experiment 5, the KL atlas (issue 30): every framework's KL option, measured exactly.

For each option (a registered core loss: rpg_openrlhf/core/kl_options.py, GRPO's k3 terms and RPG's
four divergences in two styles) on the enumerable toy policy:
  * gradients: the exact expected gradient of its KL part (A = 0, beta = 1, an exact pi_old-weighted
    sum over every sequence) against the exact gradients of FKL, RKL, UFKL, URKL (relative distance
    ||g - g_D|| / ||g_D||) and its size against zero (||g|| / ||g_RKL||), at token- and sequence-level
    weights, with pi_ref = pi_old and a fixed pi_ref, on-policy and at drifts KL(pi_old || pi_theta)
    set exactly (bisection on the drift size);
  * fixed points: where its exact on-policy expected update vanishes (deterministic Adam, as exp2's
    fixed_point), pi_ref = pi_init, against the analytic optima pi*_RKL and pi*_FKL.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch

from rpg_openrlhf.core import LossConfig
from rpg_openrlhf.core.kl_options import ALIASES, KL_OPTIONS

from . import experiments as E
from . import toy as T
from .matrix import atlas_figure
from .report import fmt, fmt_cols, md_table

DIVS = ("fkl", "rkl", "ufkl", "urkl")
SEQ_DIVS = ("fkl", "rkl")  # sequence-level UFKL / URKL have the FKL / RKL gradients (normalized policies)
SEQ_COLS = tuple(f"seq_{d}" for d in SEQ_DIVS)
KL_TARGETS = (0.0, 0.01, 0.1, 0.5)  # KL(pi_old || pi_theta) of the sequence distributions
REF_SCALE = 0.5  # fixed pi_ref = pi_old + 0.5 N(0, 1) logits (as exp1)


def options() -> list[tuple[str, str, str]]:
    """(option, registered loss name, style): every distinct function once (aliases: see aliases())."""
    short = {"differentiable": "diff", "reinforce": "reinforce"}
    rows = [(f"{n}/{short[s]}", n, s) for n in DIVS for s in short]
    return rows + [(n, n, "differentiable") for n in ("grpo_kl", "grpo_kl_corrected", *KL_OPTIONS)]


def aliases() -> dict[str, list[str]]:
    """registered name -> the other frameworks' names for the same function."""
    out: dict[str, list[str]] = {}
    for alias, ((name, _), _) in ALIASES.items():
        out.setdefault(name, []).append(alias)
    return out


def drift_for_kl(toy: T.Toy, old: torch.Tensor, direction: torch.Tensor, target: float) -> float:
    """s >= 0 with KL(pi_old || pi_old + s direction) = target (bisection; KL grows with s here)."""
    if target == 0:
        return 0.0
    old_lp = T.seq_logp(toy, old)

    def kl(s: float) -> float:
        return float(T.kl(old_lp, T.seq_logp(toy, old + s * direction)))

    lo, hi = 0.0, 1.0
    while kl(hi) < target:
        hi *= 2
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if kl(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def policies(
    toy: T.Toy, kl_targets: tuple[float, ...] = KL_TARGETS, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, dict[float, tuple[float, torch.Tensor]]]:
    """(pi_old, a fixed pi_ref, {KL(pi_old || pi_theta): (s, pi_theta)}) as logit tables: pi_theta =
    pi_old + s * a random direction, s set so that the KL is each target exactly."""
    g = torch.Generator().manual_seed(seed + 3000)
    old = T.init_logits(toy, seed)
    direction = torch.randn(old.shape, generator=g, dtype=T.DTYPE)
    fixed_ref = old + REF_SCALE * torch.randn(old.shape, generator=g, dtype=T.DTYPE)
    drifts = {k: drift_for_kl(toy, old, direction, k) for k in kl_targets}
    return old, fixed_ref, {k: (s, old + s * direction) for k, s in drifts.items()}


def divergence_grads(toy: T.Toy, level: str, theta, old, ref) -> dict[str, torch.Tensor]:
    """The exact gradients of FKL, RKL, UFKL, URKL at this weight level, and the sequence-level FKL
    and RKL too (a token-level option may descend the sequence divergence)."""
    true = {d: E.true_divergence_grad(toy, d, level, theta, old, ref) for d in DIVS}
    return true | {f"seq_{d}": E.true_divergence_grad(toy, d, "sequence", theta, old, ref) for d in SEQ_DIVS}


def distances(est: torch.Tensor, true: dict[str, torch.Tensor]) -> dict[str, float]:
    """||est - g_D|| / ||g_D|| for every target D, zero = ||est|| / ||g_RKL||, and ||est||."""
    rkl = float(true["rkl"].norm())
    return {**{d: E._rel(est - true[d], true[d]) for d in (*DIVS, *SEQ_COLS)},
            "zero": float(est.norm()) / rkl if rkl > 1e-12 else math.nan, "grad_norm": float(est.norm())}  # fmt: skip


def gradients(toy: T.Toy, kl_targets: tuple[float, ...] = KL_TARGETS, seed: int = 0) -> list[dict]:
    """One row per (ref, level, KL target, option): distances of its expected KL gradient to each divergence's."""
    old, fixed_ref, thetas = policies(toy, kl_targets, seed)
    zero_adv = torch.zeros(toy.num_seqs, dtype=T.DTYPE)
    rows = []
    for ref_name, ref in (("pi_old", None), ("fixed", fixed_ref)):
        for level in ("token", "sequence"):
            cfg = LossConfig(beta=1.0, weight_level=level, clip_reward=False)
            for target, (s, theta) in thetas.items():
                true = divergence_grads(toy, level, theta, old, old if ref is None else ref)
                for label, name, style in options():
                    est = E.exact_grad(toy, name, style, theta, old, zero_adv, ref, cfg)
                    rows.append({"ref": ref_name, "level": level, "kl_old_theta": target, "drift_s": s,
                                 "option": label, "loss": name, "style": style, **distances(est, true)})  # fmt: skip
    return rows


def fixed_points(toy: T.Toy, beta: float, steps: int, only: tuple[str, ...] | None = None) -> list[dict]:
    """One row per (level, option): where its training ends, against the analytic optima and, at token
    level, the token-level fixed points of RKL and FKL (the ends of per-token weights). `only`: a subset
    of the options (it must hold rkl/diff and fkl/diff; --quick). Each end: experiments.fixed_point
    (deterministic Adam on E_old[L] at pi_old = pi_theta, A = R - E[R], pi_ref = pi_init), lr 0.1."""
    init_lp, opt = E.optima(toy, 0, beta)
    rows = []
    for level in ("sequence", "token"):
        ends = {}
        chosen = [o for o in options() if only is None or o[0] in only]
        for label, name, style in chosen:
            ends[label] = E.fixed_point(toy, name, level, beta, steps=steps, lr=0.1, style=style)
        refs = {"pi*_RKL": opt["rkl"], "pi*_FKL": opt["fkl"]}
        if level == "token":
            refs |= {"token RKL end": ends["rkl/diff"][0], "token FKL end": ends["fkl/diff"][0]}
        for label, name, style in chosen:
            lp, gn = ends[label]
            tvs = {k: float(T.tv(lp, v)) for k, v in refs.items()}
            nearest = min(tvs, key=tvs.get)
            rows.append({"level": level, "option": label, "loss": name, "style": style,
                         "reward": float(T.expected_reward(toy, lp)), "tv_rkl_opt": tvs["pi*_RKL"],
                         "tv_fkl_opt": tvs["pi*_FKL"], "tv_token_rkl_end": tvs.get("token RKL end", math.nan),
                         "tv_token_fkl_end": tvs.get("token FKL end", math.nan),
                         "ends_at": _ends_at(nearest, tvs[nearest], float(T.expected_reward(toy, lp))),
                         "kl_from_init": float(T.kl(lp, init_lp)), "grad_norm": gn})  # fmt: skip
    return rows


def _ends_at(nearest: str, tv: float, reward: float) -> str:
    """The nearest reference point if within TV 0.01, else "none of them" with the distance and reward."""
    if tv < 0.01:
        return f"{nearest} (TV {tv:.1g})"
    return f"none of them (nearest {nearest}, TV {tv:.2f}; reward {reward:.3f})"


# ---------------------------------------------------------------------------------------- verdicts
EXACT = 1e-8  # a distance below this is an identity (float64 round-off is ~1e-15)
NAMES = {**{d: d.upper() for d in DIVS}, **{f"seq_{d}": f"sequence {d.upper()}" for d in SEQ_DIVS}}


def _cols(level: str) -> tuple[str, ...]:
    """The targets of a weight level: its own four, and at token level the sequence FKL / RKL too."""
    return (*DIVS, *SEQ_COLS) if level == "token" else DIVS


def _match(row: pd.Series, level: str, exact: float = EXACT) -> list[str]:
    """The targets whose gradient this row's equals exactly (["zero"]: no gradient at all)."""
    if row["zero"] < exact:
        return ["zero"]
    return [d for d in _cols(level) if row[d] < exact]


def summary(
    grads: pd.DataFrame, ends: pd.DataFrame, drift: float = 0.1, exact: float = EXACT
) -> pd.DataFrame:
    """One row per (option, level), every entry read from the two tables: the divergence the option
    descends exactly on-policy (fixed pi_ref), its distance to that gradient at KL(pi_old||pi_theta) =
    `drift` with a fixed pi_ref and with pi_ref = pi_old, whether it stays exact at every drift (a
    distance below `exact`), and where its training ends."""
    rows = []
    for (option, level), d in grads.groupby(["option", "level"], sort=False):
        fixed = d[d["ref"] == "fixed"].set_index("kl_old_theta")
        old = d[d["ref"] == "pi_old"].set_index("kl_old_theta")
        match = _match(fixed.loc[0.0], level, exact)
        lvl = "the token-level " if level == "token" else "the "
        if match == ["zero"]:
            target, onpol = "zero", "no KL gradient at all"
        elif match:
            target = match[0]
            own = [NAMES[m] for m in match if not m.startswith("seq_")]
            seq = [NAMES[m] for m in match if m.startswith("seq_")]
            onpol = " and ".join([lvl + " = ".join(own)] * bool(own) + ["the " + " = ".join(seq)] * bool(seq))
        else:
            target = min(_cols(level), key=lambda k: fixed.loc[0.0, k])
            onpol = "no divergence"
        nearest = "" if match else f" (nearest: {NAMES[target]}, {fixed.loc[0.0, target]:.2g} away)"
        off = [float(t.loc[k, target]) for t in (fixed, old) for k in t.index if not (t is old and k == 0)]
        exact_all = bool(match) and target != "zero" and max(off) < exact
        end = ends[(ends["option"] == option) & (ends["level"] == level)]
        rows.append({"option": option, "level": level, "on_policy_descends": onpol + nearest, "target": target,
                     f"drift_fixed_ref@{drift:g}": float(fixed.loc[drift, target]),
                     f"drift_ref_old@{drift:g}": float(old.loc[drift, target]),
                     "exact_at_every_drift": exact_all, "worst_drift": max(off),
                     "ends_at": end["ends_at"].iloc[0] if len(end) else "not run",
                     "end_tv_rkl_opt": float(end["tv_rkl_opt"].iloc[0]) if len(end) else math.nan,
                     "end_tv_fkl_opt": float(end["tv_fkl_opt"].iloc[0]) if len(end) else math.nan})  # fmt: skip
    return pd.DataFrame(rows)


def verdict(row: pd.Series, drift: float = 0.1, with_end: bool = True) -> str:
    """One sentence from one summary row: what it descends, how far it drifts, where it ends."""
    a, b, worst = row[f"drift_fixed_ref@{drift:g}"], row[f"drift_ref_old@{drift:g}"], row["worst_drift"]
    at = f"at a drift KL {drift:g} (fixed pi_ref / pi_ref = pi_old)"  # no "|": verdicts sit in tables
    if row["target"] == "zero":
        head = (
            f"has no KL gradient in expectation on-policy; off-policy one of {a:.2g} x / {b:.2g} x the size "
            f"of grad RKL {at}"
        )
    elif row["exact_at_every_drift"]:
        head = f"descends {row['on_policy_descends']} exactly, on-policy and at every drift (error <= {worst:.0e})"
    else:
        what = row["on_policy_descends"].split(" (nearest")
        near = f" (nearest{what[1]}" if len(what) > 1 else ""
        head = (
            f"descends {what[0]} exactly on-policy{near}; off-policy it is {a:.2g} / {b:.2g} "
            f"away from {NAMES[row['target']]}'s gradient {at}, {worst:.2g} at most over the drifts"
        )
    return f"{head}; training ends at {row['ends_at']}" if with_end else head


# ---------------------------------------------------------------------------------------- outputs
def outputs(grads: pd.DataFrame, ends: pd.DataFrame, out: Path) -> pd.DataFrame:
    """exp5_kl_atlas{,_ends,_summary}.csv (full precision), exp5_kl_atlas.md (the tables), the matrix.
    Returns the summary (one verdict per option and level)."""
    grads.to_csv(out / "exp5_kl_atlas.csv", index=False)
    ends.to_csv(out / "exp5_kl_atlas_ends.csv", index=False)
    summ = summary(grads, ends)
    summ.to_csv(out / "exp5_kl_atlas_summary.csv", index=False)
    same = aliases()
    tables = []
    for ref in ("pi_old", "fixed"):
        for level in ("sequence", "token"):
            d = grads[(grads["ref"] == ref) & (grads["level"] == level)]
            cols = _cols(level)
            wide = d.pivot_table(index="option", columns="kl_old_theta", values=[*cols, "zero"], aggfunc="first",
                                 sort=False)  # fmt: skip
            md = pd.DataFrame({"option": list(dict.fromkeys(d["option"]))})
            for k in sorted(d["kl_old_theta"].unique()):
                if ref == "pi_old" and k == 0:
                    continue  # every target gradient is 0 on-policy at pi_ref = pi_old (see grad_norm in the CSV)
                for c in (*cols, "zero"):
                    md[f"{c} @{k:g}"] = [fmt(wide.loc[o, (c, k)], ".2g") for o in md["option"]]
            tables.append(f"**pi_ref = {ref}, {level}-level weights**\n\n" + md_table(md))
    ecols = ["reward", "tv_rkl_opt", "tv_fkl_opt", "tv_token_rkl_end", "tv_token_fkl_end"]
    emd = fmt_cols(
        fmt_cols(ends[["level", "option", "ends_at", *ecols, "grad_norm"]], ecols), ["grad_norm"], ".1e"
    )
    alias_md = md_table(pd.DataFrame({"registered": list(same), "same function, other names": [", ".join(v) for v in same.values()]}))  # fmt: skip
    vmd = pd.DataFrame({"option": summ["option"], "level": summ["level"],
                        "verdict": [verdict(r) for _, r in summ.iterrows()]})  # fmt: skip
    (out / "exp5_kl_atlas.md").write_text(
        "Verdicts (each number from the tables below):\n\n" + md_table(vmd) + "\nThe KL atlas. Relative distance ||g - g_D|| / ||g_D|| of each option's exact expected KL gradient g "
        "(A = 0, beta = 1) to the exact gradient g_D of each divergence D; `zero` = ||g|| / ||g_RKL|| (0: the "
        "option has no KL gradient in expectation). Column suffix: KL(pi_old || pi_theta). Token level: D is "
        "sum_h pi_old(h) D(pi_theta(.|h), pi_ref(.|h)), the prefix weights held fixed.\n\n" + "\n".join(tables)
        + "\n\nWhere training ends (fixed point of the exact on-policy expected update, pi_ref = pi_init, "
        "total variation to each point; ends_at: the nearest one if TV < 0.01):\n\n" + md_table(emd)
        + "\n\nAliases (registered as the same function):\n\n" + alias_md
    )  # fmt: skip
    atlas_figure(summ, out / "exp5_kl_atlas.png", same, EXACT)
    return summ


def readme_section(summ: pd.DataFrame, ends: pd.DataFrame, beta: float, steps: int) -> str:
    """5. The KL atlas, for results/mechanisms/README.md (numbers from this run's frames)."""
    lines = "\n".join(f"- `{r['option']}` ({r['level']}): {verdict(r)}." for _, r in summ.iterrows())
    same = "; ".join(f"`{k}` = " + ", ".join(f"`{a}`" for a in v) for k, v in aliases().items())
    return f"""
## 5. The KL atlas: every framework's KL option, measured exactly (`exp5_kl_atlas.*`)

**Question (issue 30).** Each framework offers its own KL option (OpenRLHF's k1/k2/k3 as a loss or in the
reward and `--algo.kl.unbiased_gradient`, verl's `kl_loss_type` incl. the `+` straight-through forms,
TRL's `use_bias_correction_kl`, slime's `--use-unbiased-kl`, NeMo-RL's `use_on_policy_kl_approximation`,
DeepSeek-V3.2's weighted k3, GRPO's k3). Which divergence does each one's expected update descend, at
token and at sequence level, on-policy and as pi_theta drifts from pi_old, and where does training end?
Sources and formulas: `docs/kl-options.md`; every option is a registered core loss
(`rpg_openrlhf/core/kl_options.py`, `rpg-train --rpg.loss NAME`).

**Setup.** A = 0 and beta = 1 isolate the KL part; exact expectations over the 256 sequences; pi_theta =
pi_old + s * random direction with s set so that KL(pi_old || pi_theta) is exactly 0, 0.01, 0.1, 0.5;
pi_ref = pi_old or a fixed pi_ref (pi_old + 0.5 N(0, 1) logits). Relative distance ||g - g_D|| / ||g_D||
to FKL, RKL, UFKL, URKL (for normalized policies FKL and UFKL, RKL and URKL have the same gradient);
"zero" = ||g|| / ||g_RKL||. Where training ends: the fixed point of the exact on-policy expected update
(deterministic Adam, {steps} steps, pi_ref = pi_init, beta = {beta}, A = R - E[R]), against the analytic
optima; at token level also against the token-level fixed points of RKL and FKL (`exp5_kl_atlas_ends.csv`).
Aliases (the same registered function): {same}.

**Measured** (one sentence per option, every number from `exp5_kl_atlas_summary.csv`):
{lines}

**Verdict.** See `docs/kl-options.md` for the reading per framework. The published claims reproduced
exactly (tests/test_kl_options.py): k3's expectation is the unnormalized KL; k3 as a loss has the FKL
gradient on-policy (sequence level; at token level the per-prefix FKL); k2 as a loss has the gradient of
k1 in the reward on-policy at sequence level (at token level they differ: k1 in the reward, summed as
returns-to-go, descends the sequence RKL, k2 the per-prefix RKL); the bias-corrected k3 has the URKL
gradient at every drift.
"""
