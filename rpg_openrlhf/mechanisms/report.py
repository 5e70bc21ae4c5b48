"""Tables (CSV + Markdown) and plots (PNG, matplotlib Agg) for the mechanism experiments."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI or the training nodes
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def fmt(x: float, spec: str = ".3f") -> str:
    return "nan" if pd.isna(x) else format(x, spec)


def md_table(df: pd.DataFrame) -> str:
    """A GitHub Markdown table of a (string-formatted) frame, no index."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def fmt_cols(df: pd.DataFrame, cols, spec: str = ".3f") -> pd.DataFrame:
    """A copy of ``df`` with ``cols`` formatted by ``spec``."""
    out = df.copy()
    for c in cols:
        out[c] = out[c].map(lambda v: fmt(v, spec))
    return out


def save_figure(fig, path: Path, dpi: int = 120) -> None:
    """Lay ``fig`` out, write it as a PNG and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def kl_columns(df: pd.DataFrame) -> dict[float, str]:
    """drift s -> its column name "KL=<KL(pi_old || pi_theta)>"."""
    return {s: f"KL={k:.3g}" for s, k in df.groupby("drift_s")["kl_old_theta"].first().items()}


def mean_std(df: pd.DataFrame, keys: list[str], cols: list[str]) -> pd.DataFrame:
    """Group by ``keys``: mean and std (ddof=1; 0 for one seed) of ``cols`` as <col>_mean, <col>_std."""
    g = df.groupby(keys, sort=False)[cols]
    m, s = g.mean(), g.std(ddof=1).fillna(0.0)
    res = pd.concat([m.add_suffix("_mean"), s.add_suffix("_std")], axis=1).reset_index()
    res["n_seeds"] = g.size().values
    return res


def seed_summary(df: pd.DataFrame, keys: list[str], cols: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """mean_std(df, keys, cols) and its Markdown form: keys, n_seeds, "mean ± std" of each col."""
    summ = mean_std(df, keys, cols)
    md = summ[[*keys, "n_seeds"]].copy()
    for c in cols:
        md[c] = pm(summ, c)
    return summ, md


def pm(df: pd.DataFrame, col: str, spec: str = ".3f") -> pd.Series:
    return (
        df[f"{col}_mean"].map(lambda v: fmt(v, spec)) + " ± " + df[f"{col}_std"].map(lambda v: fmt(v, spec))
    )


# ---------------------------------------------------------------------------------------- exp 1


EXP1_CURVES = (
    ("grpo_kl", "urkl", "GRPO k3 vs URKL/RKL", "tab:red", "-"),
    ("grpo_kl", "fkl", "GRPO k3 vs FKL/UFKL", "tab:red", "--"),
    ("grpo_kl_corrected", "urkl", "corrected vs URKL/RKL", "tab:blue", "-"),
    ("grpo_kl_corrected", "fkl", "corrected vs FKL/UFKL", "tab:blue", "--"),
)


def exp1_outputs(df: pd.DataFrame, out: Path) -> pd.DataFrame:
    """Pivot (rows: ref, level, loss, divergence; columns: KL(old||theta)) of relative errors."""
    kl_cols = kl_columns(df)
    sub = df[df["loss"].str.startswith("grpo")].copy()
    sub["col"] = sub["drift_s"].map(kl_cols)
    piv = sub.pivot_table(index=["ref", "level", "loss", "divergence"], columns="col", values="rel_error",
                          aggfunc="first", sort=False)  # fmt: skip
    piv = piv[list(kl_cols.values())].reset_index()
    md = fmt_cols(piv, kl_cols.values(), ".1e")
    df.to_csv(out / "exp1_kl_gradient_bias.csv", index=False)
    (out / "exp1_kl_gradient_bias.md").write_text(
        "Relative gradient error ||E_old[grad L] - grad D|| / ||grad D|| (A = 0, beta = 1, exact "
        "expectations). Columns: KL(pi_old || pi_theta) of the sequence distributions.\n\n" + md_table(md)
    )
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    for i, ref in enumerate(("old", "fixed")):
        for j, level in enumerate(("sequence", "token")):
            ax = axes[i, j]
            d = df[(df["ref"] == ref) & (df["level"] == level)]
            for loss, div, label, color, ls in EXP1_CURVES:
                c = d[(d["loss"] == loss) & (d["divergence"] == div)].sort_values("kl_old_theta")
                err = c["rel_error"].clip(lower=1e-17)
                ax.plot(c["kl_old_theta"], err, ls, color=color, marker="o", label=label)
            rpg = d[d["loss"].isin(["fkl", "rkl", "ufkl", "urkl"])].groupby("kl_old_theta")["rel_error"].max()
            label = "RPG losses vs own D (max)"
            ax.plot(rpg.index, rpg.clip(lower=1e-17), ":", color="k", marker="x", label=label)
            ax.set_yscale("log")
            ax.set_title(f"pi_ref = {'pi_old' if ref == 'old' else 'fixed policy'}, {level}-level weights")
            ax.set_xlabel("KL(pi_old || pi_theta)")
            ax.set_ylabel("relative gradient error")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    save_figure(fig, out / "exp1_kl_gradient_bias.png")
    return piv


# ---------------------------------------------------------------------------------------- exp 2

EXP2_COLS = ["reward", "tv_rkl_opt", "tv_fkl_opt", "kl_rkl_opt", "kl_fkl_opt", "tv_fixed_point"]


def exp2_outputs(runs: pd.DataFrame, refs: pd.DataFrame, base_rows: pd.DataFrame, out: Path) -> pd.DataFrame:
    summ, md = seed_summary(runs, ["level", "loss", "style", "target"], EXP2_COLS)
    runs.to_csv(out / "exp2_runs.csv", index=False)
    summ.to_csv(out / "exp2_where_training_ends.csv", index=False)
    refs.to_csv(out / "exp2_reference_points.csv", index=False)
    rmd = fmt_cols(
        fmt_cols(refs, ["reward", "tv_rkl_opt", "tv_fkl_opt", "kl_from_init"]), ["grad_norm"], ".1e"
    )
    _, bmd = seed_summary(base_rows, ["baseline", "group_size"], ["reward", "tv_opt_beta", "tv_opt_beta_eff"])
    base_rows.to_csv(out / "exp2_baseline.csv", index=False)
    (out / "exp2_where_training_ends.md").write_text(
        "Final exact distances (mean ± std over seeds). tv_rkl_opt / tv_fkl_opt: total variation to the "
        "analytic optimum of E[R] - beta KL(pi || pi_ref) / E[R] - beta KL(pi_ref || pi); kl_*_opt: "
        "KL(pi_final || optimum); tv_fixed_point: to the exact fixed point of the method's expected "
        "on-policy update at that weight level.\n\n" + md_table(md)
        + "\n\nReference points (exact; fixed points by deterministic exact-gradient iteration):\n\n" + md_table(rmd)
        + "\n\nGroup-mean vs leave-one-out baseline (rkl, differentiable, sequence level): tv to the "
        "optimum for beta and for beta * n/(n-1):\n\n" + md_table(bmd)
    )  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for ax, level in zip(axes, ("sequence", "token")):
        d = summ[summ["level"] == level].reset_index(drop=True)
        if d.empty:
            continue
        x = range(len(d))
        names = d["loss"].str.replace("grpo_kl_corrected", "grpo_corr")
        labels = [f"{n}\n{s[:5]}" for n, s in zip(names, d["style"])]
        bars = (("tv_rkl_opt", "TV to pi*_RKL"), ("tv_fkl_opt", "TV to pi*_FKL"),
                ("tv_fixed_point", "TV to the exact fixed point of its expected update"))  # fmt: skip
        for k, (col, lab) in enumerate(bars):
            ax.bar([i + (k - 1) * 0.27 for i in x], d[f"{col}_mean"], 0.27, yerr=d[f"{col}_std"], label=lab)
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_title(f"{level}-level weights: where training ends")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("total variation distance")
    axes[0].legend()
    save_figure(fig, out / "exp2_where_training_ends.png")
    return summ


# ---------------------------------------------------------------------------------------- exp 3


def exp3_outputs(var: pd.DataFrame, trn: pd.DataFrame, out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    var.to_csv(out / "exp3_clip_variance.csv", index=False)
    kl_cols = kl_columns(var)
    v = var.copy()
    v["col"] = v["drift_s"].map(kl_cols)
    order = list(dict.fromkeys(var["setting"]))
    tables = []
    for metric in ("grad_variance", "rel_variance", "rel_bias", "clip_frac"):
        piv = v.pivot_table(index="setting", columns="col", values=metric, aggfunc="first")
        piv = piv.loc[order, list(kl_cols.values())].reset_index()
        md = fmt_cols(piv, kl_cols.values(), ".2e" if metric != "clip_frac" else ".2f")
        tables.append(f"**{metric}**\n\n" + md_table(md))
    tsum, tmd = seed_summary(trn, ["epochs", "setting"], ["reward", "tv_rkl_opt", "max_kl_from_init"])
    trn.to_csv(out / "exp3_clip_training_runs.csv", index=False)
    tsum.to_csv(out / "exp3_clip_training.csv", index=False)
    (out / "exp3_clip.md").write_text(
        "Sampled-gradient statistics as pi_theta drifts from the behaviour policy pi_old (= pi_ref). "
        "grad_variance: tr Cov of the mini-batch gradient (rel_variance: divided by ||g_ref||^2); rel_bias: "
        "||mean batch gradient - g_ref|| / ||g_ref|| with g_ref the exact expected gradient of the unclipped "
        "REINFORCE-style loss (for 'none' this is Monte Carlo error only); clip_frac: fraction of tokens in a zero-gradient "
        "branch. Columns: KL(pi_old || pi_theta).\n\n" + "\n".join(tables)
        + "\n\nTraining (exact final reward, TV to pi*_RKL, largest KL from the initial policy):\n\n" + md_table(tmd)
    )  # fmt: skip
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for label in order:
        d = var[var["setting"] == label].sort_values("kl_old_theta")
        style = "-" if "c=" not in label else ("--" if "c=3" in label else ":")
        axes[0].plot(d["kl_old_theta"], d["grad_variance"], style, marker="o", label=label)
        axes[1].plot(d["kl_old_theta"], d["rel_bias"], style, marker="o", label=label)
    for ax, t in zip(axes[:2], ("gradient variance (tr Cov)", "relative bias vs unclipped expectation")):
        ax.set_xlabel("KL(pi_old || pi_theta)")
        ax.set_yscale("log")
        ax.set_title(t)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    epochs = sorted(tsum["epochs"].unique())
    width = 0.8 / max(len(epochs), 1)
    for k, e in enumerate(epochs):
        d = tsum[tsum["epochs"] == e].set_index("setting").loc[order]
        axes[2].bar([i + k * width for i in range(len(order))], d["reward_mean"], width, yerr=d["reward_std"],
                    label=f"{e} epoch(s) per rollout")  # fmt: skip
    axes[2].set_xticks([i + 0.4 - width / 2 for i in range(len(order))], order, rotation=45, fontsize=7)
    axes[2].set_ylim(max(0.0, float((tsum["reward_mean"] - tsum["reward_std"]).min()) - 0.1), 1.0)
    axes[2].set_title("final expected reward")
    axes[2].legend(fontsize=7)
    save_figure(fig, out / "exp3_clip.png")
    return var, tsum


# ---------------------------------------------------------------------------------------- exp 4


def exp4_outputs(
    traj: pd.DataFrame, finals: pd.DataFrame, frontier: pd.DataFrame, out: Path, beta: float | None = None
) -> pd.DataFrame:
    traj.to_csv(out / "exp4_reference_trajectories.csv", index=False)
    frontier.to_csv(out / "exp4_frontier.csv", index=False)
    fsum, md = seed_summary(finals, ["schedule"], ["reward", "kl_from_init", "refreshes"])
    md["refreshes"] = pm(fsum, "refreshes", ".1f")
    finals.to_csv(out / "exp4_reference_runs.csv", index=False)
    fsum.to_csv(out / "exp4_reference.csv", index=False)
    (out / "exp4_reference.md").write_text(
        "Final exact expected reward and KL(pi_theta || pi_init) per reference schedule (mean ± std).\n\n"
        + md_table(md)
    )
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.plot(frontier["kl_from_init"], frontier["reward"], "k-", lw=2, alpha=0.5,
            label="frontier: pi* ∝ pi_init exp(R/b), all b")  # fmt: skip
    if beta is not None:
        k = (frontier["beta"] - beta).abs().idxmin()
        ax.plot(frontier.loc[k, "kl_from_init"], frontier.loc[k, "reward"], "k*", ms=12,
                label=f"optimum of the fixed reference (b = {frontier.loc[k, 'beta']:.2g})")  # fmt: skip
    for label in dict.fromkeys(traj["schedule"]):
        for seed, d in traj[traj["schedule"] == label].groupby("seed"):
            ax.plot(d["kl_from_init"], d["reward"], alpha=0.8, lw=1, label=label if seed == traj["seed"].min() else None,
                    color=f"C{list(dict.fromkeys(traj['schedule'])).index(label)}")  # fmt: skip
    ax.set_xlabel("KL(pi_theta || pi_init)")
    ax.set_ylabel("expected reward (exact)")
    ax.set_title("iterative reference: reward vs distance from the initial policy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, out / "exp4_reference.png")
    return fsum
