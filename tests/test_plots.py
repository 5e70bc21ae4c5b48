"""rpg_eval.report.plots: TensorBoard tags found by alias, figures rendered as valid PNG/PDF with the expected lines."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest
from rpg_eval.report import plots as P
from test_eval_compare import refuses

# Tags as OpenRLHF 0.11.2 writes them (train/<status key>), plus RPG's loss metrics.
OPENRLHF_TAGS = ("train/reward", "train/response_length", "train/entropy_loss", "train/kl", "train/ppo_clip_ratio",
                 "train/ppo_kl", "train/rollout/reward_mean", "train/rollout/response_length_mean",
                 "train/timing/step_total")  # fmt: skip
RPG_TAGS = ("train/w_mean", "train/w_max", "train/w_min", "train/clip_frac_low", "train/clip_frac_high")


def _write_events(log_dir: Path, tags: tuple[str, ...], scale: float = 1.0) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(log_dir))
    for s in range(1, 13):
        for i, tag in enumerate(tags):
            w.add_scalar(tag, scale * (i + 1) * (1 - math.exp(-s / 5)), s)
        w.add_scalar("eval/reward", 0.5, s)  # eval tags never stand in for training metrics
    w.close()
    return log_dir


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def tb_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tensorboard")
    _write_events(root / "rpg_ufkl", OPENRLHF_TAGS + RPG_TAGS)
    _write_events(root / "grpo", OPENRLHF_TAGS, scale=0.8)
    return root


def test_resolve_tag_aliases() -> None:
    tags = ["train/reward", "train/rollout/reward_mean", "eval/kl", "train/rpg/w_mean", "train/rpg_w_max"]
    assert P.resolve_tag("reward", tags) == "train/reward"
    assert P.resolve_tag("reward", ["train/rollout/reward_mean"]) == "train/rollout/reward_mean"
    assert P.resolve_tag("kl", tags) is None  # eval/kl is not a training metric
    assert P.resolve_tag("w_mean", tags) == "train/rpg/w_mean"  # suffix match
    assert P.resolve_tag("w_max", tags) == "train/rpg_w_max"  # rpg_ prefix on the last segment
    assert P.resolve_tag("entropy", ["train/entropy_loss", "train/policy_entropy"]) == "train/policy_entropy"
    assert P.resolve_tag("entropy", ["train/entropy_loss"]) == "train/entropy_loss"
    # train/ wins over other prefixes for the same candidate
    assert P.resolve_tag("w_min", ["actor/w_min", "train/w_min"]) == "train/w_min"
    aliases = P._parse_aliases(["reward=custom/score"])
    assert P.resolve_tag("reward", ["custom/score", "train/reward"], aliases) == "custom/score"


def test_load_scalars_reads_openrlhf_events(tb_root: Path) -> None:
    sc = P.load_scalars(tb_root / "rpg_ufkl")
    assert set(OPENRLHF_TAGS + RPG_TAGS) <= set(sc)
    df = sc["train/reward"]
    assert list(df["step"]) == list(range(1, 13))
    assert df["value"].iloc[-1] == pytest.approx(1 - math.exp(-12 / 5), rel=1e-6)
    assert sorted(P.discover_runs(tb_root)) == ["grpo", "rpg_ufkl"]
    assert list(P.discover_runs(tb_root / "grpo", "GRPO")) == ["GRPO"]


def test_plot_run_renders_png_and_pdf_with_the_panels_that_have_data(tb_root: Path, tmp_path: Path) -> None:
    res = P.plot_run("rpg_ufkl", P.load_scalars(tb_root / "rpg_ufkl"), tmp_path, smooth_weight=0.5)
    assert res.series == {
        "reward": ["reward (train/reward)"],
        "response_length": ["response_length (train/response_length)"],
        "entropy": ["entropy (train/entropy_loss)"],
        "kl": ["kl (train/kl)"],
        "clip_fraction": ["clip_frac_low (train/clip_frac_low)", "clip_frac_high (train/clip_frac_high)",
                          "ppo_clip_ratio (train/ppo_clip_ratio)"],
        "importance_weight": ["w_mean (train/w_mean)", "w_max (train/w_max)", "w_min (train/w_min)"],
    }  # fmt: skip
    assert [p.name for p in res.paths] == ["run_rpg_ufkl.png", "run_rpg_ufkl.pdf"]
    w, h = _png_size(res.paths[0])
    assert w > 800 and h > 400  # a 3 x 2 grid of panels
    assert res.paths[1].read_bytes()[:5] == b"%PDF-"
    res = P.plot_run("grpo", P.load_scalars(tb_root / "grpo"), tmp_path, formats=["png"])
    assert "importance_weight" not in res.series  # no RPG metrics: no panel of them
    assert res.series["clip_fraction"] == ["ppo_clip_ratio (train/ppo_clip_ratio)"]
    with pytest.raises(P.PlotError, match=r"run 'x': none of the metrics .* add --alias"):
        P.plot_run(
            "x", {"train/timing/step_total": P.load_scalars(tb_root / "grpo")["train/reward"]}, tmp_path
        )


def test_overlay_across_runs(tb_root: Path) -> None:
    runs = {name: P.load_scalars(d) for name, d in P.discover_runs(tb_root).items()}
    figures = P.overlay_figures(runs, panels=["reward", "importance_weight"])
    assert {panel: labels for panel, (_, labels) in figures.items()} == {
        "reward": ["grpo", "rpg_ufkl"],
        "importance_weight": ["rpg_ufkl: w_mean", "rpg_ufkl: w_max", "rpg_ufkl: w_min"],
    }


def _summary(path: Path) -> Path:
    """Runs rpg and grpo on aime24 and amc23 at steps 10, 20, 30, with intervals."""
    rows = [f"{run},global_step{step},{step},{bench},math_verify,32,{m},{m - 0.05},{m + 0.05}\n"
            for run, base in (("rpg", 0.3), ("grpo", 0.2)) for step in (10, 20, 30) for bench in ("aime24", "amc23")
            for m in [base + step / 100]]  # fmt: skip
    path.write_text("run,checkpoint,step,benchmark,grader,n_samples,mean,ci_low,ci_high\n" + "".join(rows))
    return path


def test_eval_scores_against_step(tmp_path: Path) -> None:
    df = P.load_summary([_summary(tmp_path / "summary.csv")])
    _, res = P.eval_figure(df, labels={"rpg": "RPG (ours)"})
    assert res.series == {"aime24": ["RPG (ours)", "grpo"], "amc23": ["RPG (ours)", "grpo"]}
    with pytest.raises(P.PlotError, match=r"benchmark\(s\) aime25 not in the summary"):
        P.eval_figure(df, benchmarks=["aime25"])
    with pytest.raises(P.PlotError, match=r"no rows with grader 'paper'"):
        P.eval_figure(df, grader="paper")
    # maj@k (with its interval) beside or instead of mean@k; a summary.csv written before it: an error
    maj = tmp_path / "maj.csv"
    maj.write_text(
        "run,checkpoint,step,benchmark,grader,mean,ci_low,ci_high,maj,maj_ci_low,maj_ci_high\n"
        "r,a,10,aime24,math_verify,0.2,0.1,0.3,0.4,0.3,0.5\nr,b,20,aime24,math_verify,0.3,0.2,0.4,0.5,0.4,0.6\n"
    )
    for metrics, want in ((["mean", "maj"], ["r mean@k", "r maj@k"]), (["maj"], ["r maj@k"])):
        assert P.eval_figure(P.load_summary([maj]), metrics=metrics)[1].series["aime24"] == want
    with pytest.raises(P.PlotError, match="maj"):
        P.eval_figure(df, metrics=["maj"])


def test_cli_main(tb_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plots"
    rc = P.main(["--tb", f"RPG={tb_root / 'rpg_ufkl'}", str(tb_root / "grpo"), "--summary",
                 str(_summary(tmp_path / "summary.csv")), "--out", str(out), "--panels", "reward,kl",
                 "--smooth", "0.6"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    # the folder is rpg-eval plot's (its lock, its mark): a second call may write it again
    stems = ("run_RPG", "run_grpo", "overlay_reward", "overlay_kl", "eval")
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted([".lock", ".rpg-owner"] + [f"{s}.{ext}" for s in stems for ext in ("png", "pdf")])
    assert all(_png_size(out / f"{s}.png") for s in stems)
    assert "RPG: reward: reward (train/reward)" in capsys.readouterr().out


def test_cli_errors_are_one_line_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header_only = tmp_path / "header.csv"  # it gave ZeroDivisionError
    header_only.write_text("run,checkpoint,step,benchmark,grader,mean\n")
    bad = tmp_path / "s.csv"
    bad.write_text("run,step,mean\nr,1,0.5\n")
    cases = {"nothing to plot": [], "no TensorBoard event files": ["--tb", str(tmp_path)],
             "s.csv: missing column(s) benchmark": ["--summary", str(bad)],
             "--panels: unknown rewrd": ["--summary", str(bad), "--panels", "rewrd"],
             "--metric: unknown nope": ["--summary", str(bad), "--metric", "nope"],
             f"{header_only}: no rows": ["--summary", str(header_only)]}  # fmt: skip
    out = ["--out", str(tmp_path / "plots"), "--formats", "png"]
    for said, argv in cases.items():
        refuses(capsys, [*argv, *out], said, tmp_path, main=P.main)
    # a link at an output name (eval.png -> elsewhere) in a folder of rpg-eval plot: refused, never written through
    good = tmp_path / "summary.csv"
    good.write_text("run,checkpoint,step,benchmark,grader,mean\nr,c,1,aime24,math_verify,0.5\n")
    (tmp_path / "victim").write_bytes(b"keep")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / ".rpg-owner").write_text("rpg-eval plot\n")
    (tmp_path / "plots" / "eval.png").symlink_to(tmp_path / "victim")
    said = f"{tmp_path / 'plots' / 'eval.png'}: is a symbolic link"
    assert refuses(capsys, ["--summary", str(good), *out], said, tmp_path, main=P.main).startswith(
        "rpg-eval plot:"
    )
