"""Experiment 6's tables: one verdict per (framework option, weight level) read from the measured rows,
the conformance table (docs/kl-options.md leads with it), exp6_conformance.{csv,md} and its summary."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from . import atlas as A
from . import conformance as C
from . import toy as T
from .matrix import conformance_figure
from .report import md_table

EXACT_FLOAT32 = 1e-5  # a divergence's gradient matched to float32 rounding (float64: atlas.EXACT)
NO_ENDS = pd.DataFrame(columns=["option", "level", "ends_at", "tv_rkl_opt", "tv_fkl_opt"])


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (framework option, level): what its code descends (atlas.summary on its rows with
    advantages 0, to float32 rounding where upstream computes in float32); how far its expected gradient
    is from the registered option's over every case (agreement_max: within AGREE, or AGREE_FLOAT32
    where upstream computes in float32) and, at token level, per entry at extreme log-ratios
    (extreme_agreement: within conformance.EXTREME); agrees: both hold. deep_l_agreement: the same where
    l < -8, measured only (TRL's float32 autograd of w k3 cancels there: exp6_conformance.md says so)."""
    out, options = [], {(o.framework, o.name): o for o in C.OPTIONS}
    for (framework, name, level), d in rows.groupby(["framework", "option", "level"], sort=False):
        option = options[(framework, name)]
        extreme, deep = (d[d["ref"] == ref]["agreement"] for ref in ("extreme", "extreme, l < -8"))
        d = d[~d["ref"].str.startswith("extreme")]
        grads = d[d["advantages"] == "0"].assign(option=name)
        s = A.summary(grads, NO_ENDS, exact=EXACT_FLOAT32 if option.float32 else A.EXACT).iloc[0]
        worst = d.loc[d["agreement"].idxmax()] if option.calls else None
        tol = C.AGREE_FLOAT32 if option.float32 else C.AGREE
        agrees = None if worst is None else bool(worst["agreement"] <= tol and (extreme <= C.EXTREME).all())
        out.append({"framework": framework, "version": d["version"].iloc[0], "option": name, "loss": option.loss,
                    "level": level, "implementation": "upstream code" if option.calls else C.REIMPLEMENTATION,
                    "calls": option.calls or option.source, "arithmetic": option.float32 or "float64",
                    **s.drop(["option", "level", "ends_at", "end_tv_rkl_opt", "end_tv_fkl_opt"]).to_dict(),
                    "agreement_max": math.nan if worst is None else float(worst["agreement"]),
                    "worst_case": "" if worst is None else _case(worst),
                    "extreme_agreement": float(extreme.max()) if len(extreme) else math.nan,
                    "deep_l_agreement": float(deep.max()) if len(deep) else math.nan,
                    "agrees": agrees})  # fmt: skip
    summ = pd.DataFrame(out)
    summ["verdict"] = [A.verdict(r, with_end=False) for _, r in summ.iterrows()]
    return summ


def _case(row: pd.Series) -> str:
    return f"{row['ref']}, KL {row['kl_old_theta']:g}, A = {row['advantages']}"


def _small(x: float) -> str:
    return "0" if x == 0 else f"{x:.0e}"


def agreement_text(d: pd.DataFrame) -> str:
    """Whether the registered option equals the framework's code (d: its summary rows, both levels)."""
    if (d["implementation"] == C.REIMPLEMENTATION).all():
        return "re-implementation (not on PyPI)"
    worst = d.loc[d["agreement_max"].idxmax()]
    extreme = f"; extreme log-ratios {_small(d['extreme_agreement'].max())}"
    if not d["agrees"].all():
        return f"**differs**: {worst['agreement_max']:.2g} ({worst['level']} level, {worst['worst_case']}){extreme}"
    if worst["agreement_max"] <= C.AGREE:
        return f"equal ({_small(worst['agreement_max'])}{extreme})"
    return f"equal to float32 rounding ({_small(worst['agreement_max'])}{extreme})"


def reading(row: pd.Series) -> str:
    """A cell: the divergence descended on-policy and the distance to its gradient off-policy."""
    a, worst = row["drift_fixed_ref@0.1"], row["worst_drift"]
    exact = A.EXACT if row.get("arithmetic", "float64") == "float64" else EXACT_FLOAT32
    if row["target"] == "zero":
        return f"no KL gradient on-policy; off-policy {a:.2g} x grad RKL"
    name = A.NAMES[row["target"]]
    if row["exact_at_every_drift"]:
        return f"**{name}**, at every drift"
    if row["on_policy_descends"].startswith("no divergence"):
        return f"none (nearest {name}, {row['on_policy_descends'].split(', ')[-1].rstrip(')')}); {a:.2g} off-policy"
    if a < exact:
        return f"**{name}** on-policy and at KL 0.1; {worst:.2g} from it at most over the drifts"
    return f"**{name}** on-policy; {a:.2g} from it off-policy"


def table(summ: pd.DataFrame) -> str:
    """The conformance table: one row per framework option, both weight levels side by side."""
    rows = []
    for (framework, version, name), d in summ.groupby(["framework", "version", "option"], sort=False):
        by = d.set_index("level")
        rows.append({"framework": f"{framework} {version}" if version != C.REIMPLEMENTATION else
                     f"{framework} ({C.REIMPLEMENTATION})", "option": name, "`--rpg.loss`": f"`{by.iloc[0]['loss']}`",
                     "token level": reading(by.loc["token"]), "sequence level": reading(by.loc["sequence"]),
                     "registered option vs upstream": agreement_text(d)})  # fmt: skip
    return md_table(pd.DataFrame(rows))


def notes(summ: pd.DataFrame) -> str:
    """What the table's last column measures, and the differences it does not count (numbers from summ)."""
    up = summ[summ["implementation"] == "upstream code"]
    deep = up[up["deep_l_agreement"] > C.EXTREME]
    toy = T.make_toy()
    batch = C.extreme_batch(toy)
    log_rho, log_w = batch.ref - batch.old, C.logits_logp(toy, batch.logits) - batch.old
    lines = [
        f"- Every case: the largest ||g_upstream - g_registered|| / max(||g_registered||, ||grad RKL||) over both weight "
        f"levels, pi_ref = pi_old or fixed, every drift, advantages 0 and R - mean R. Extreme log-ratios (token "
        f"level, advantages 0, `conformance.extreme_batch`): log(pi_ref/pi_old) in ({float(log_rho.min()):.0f}, "
        f"{float(log_rho.max()):.0f}) and log w in ({float(log_w.min()):.0f}, {float(log_w.max()):.0f}), beyond the +-20 "
        f"the core clamps its own losses at, l = log(pi_theta/pi_ref) in {C.EXTREME_L}: the largest per-entry "
        f"relative difference of the two gradients, {up['extreme_agreement'].max():.0e} at most "
        f"(held to {C.EXTREME:g}).",
        "- The reward term of every registered option is OpenRLHF's PolicyLoss (the run is OpenRLHF's): log w "
        "clamped at +-20, no dual clip unless `--rpg.clip_c`. TRL's own PPO term has no clamp, so with A != 0 and "
        "|log w| > 20 the two differ (the cases above stay inside it).",
    ]
    lines += [f"- {r['framework']} {r['version']} `{r['option']}`: where l < -8 (pi_theta rates the sampled token more than "
              f"e^8 below pi_ref) its own gradient is up to {r['deep_l_agreement']:.2g} (relative, per entry) off its formula's: "
              "its float32 log-probs get the gradients of k3 and of w separately, each ~ w e^-l, and autograd adds them "
              "in float32; the registered option computes w l exactly." for _, r in deep.iterrows()]  # fmt: skip
    return "\n".join(lines) + "\n"


def outputs(rows: pd.DataFrame, out: Path) -> pd.DataFrame:
    """exp6_conformance.csv (every case), exp6_conformance_summary.csv, exp6_conformance.md, the matrix."""
    rows.to_csv(out / "exp6_conformance.csv", index=False)
    summ = summary(rows)
    exact = {"float64": A.EXACT, **{o.float32: EXACT_FLOAT32 for o in C.OPTIONS if o.float32}}
    conformance_figure(summ, out / "exp6_conformance.png", exact)
    summ.to_csv(out / "exp6_conformance_summary.csv", index=False)
    versions = ", ".join(f"{f} {v}" for f, v in dict(zip(summ["framework"], summ["version"])).items()
                         if v != C.REIMPLEMENTATION)  # fmt: skip
    calls = md_table(
        summ.drop_duplicates(["framework", "calls"])[["framework", "version", "calls", "arithmetic"]]
    )
    verdicts = md_table(summ[["framework", "option", "level", "verdict"]])
    (out / "exp6_conformance.md").write_text(
        f"Conformance ({versions}): each framework's KL option run from its own code on the enumerable policy, "
        "against the registered `--rpg.loss`. Regenerate: `rpg-mechanisms conformance --out results/mechanisms`.\n\n"
        + table(summ) + "\n" + notes(summ)
        + "\nFunctions called (beta = 1, every token counted, pi_old-weighted exact expectations):\n\n"
        + calls + "\nVerdicts (advantages 0: the KL part alone; off-policy distances at KL(pi_old || pi_theta) = 0.1, "
        "fixed pi_ref / pi_ref = pi_old):\n\n" + verdicts)  # fmt: skip
    return summ


#: 6. in results/mechanisms/README.md: experiment 6 is its own command, its numbers live in its files
README_SECTION = """
## 6. Conformance: the frameworks' own code (`exp6_conformance.*`, `rpg-mechanisms conformance`)

**Question (issue 39).** The atlas (5) measures the registered re-implementations. Does each framework's
own code, as installed, compute what its registered `--rpg.loss` computes, and which divergence does it
descend? `rpg-mechanisms conformance --out results/mechanisms` (its own command: it runs TRL and verl,
installed by `make setup` beside the stack) calls OpenRLHF's `compute_approx_kl`, `PolicyLoss`,
`aggregate_loss` and its experience maker's `compute_advantages_and_returns`, verl's `ppo_loss`
(`compute_policy_loss_vanilla`, `kl_penalty`, `agg_loss`) and TRL's `GRPOTrainer.compute_loss` (a real
trainer over a tiny model whose logits are the enumerable policy's), given float64 log-probs of all 256
sequences, and weights each entry's gradient by pi_old: the exact expected gradient, in every case of
the atlas (both weight levels, pi_ref = pi_old or fixed, the drifts) with advantages 0 (the KL part:
which divergence) and R - mean R (the whole loss, PPO clip included), and per entry at extreme
log-ratios. slime, NeMo-RL and DeepSeek-V3.2 are not on PyPI: their rows are the registered
re-implementation. The table with the framework versions, the notes on what differs and one verdict
per row: `exp6_conformance.md`; the matrix: `exp6_conformance.png`; every case: `exp6_conformance.csv`;
docs/kl-options.md leads with the table.
"""
