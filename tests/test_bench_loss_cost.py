"""bench/loss_cost.py compares like with like: on the benchmark's own inputs, RPG's grpo_kl is
OpenRLHF's PolicyLoss + beta k3 KL loss against the same reference (value and gradient), for
both pairs; and a tiny run produces a row per (variant, pair)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def loss_cost():
    # The bench registers a bare `openrlhf.models` package (its process imports nothing else
    # from it); put the real modules back afterwards so later tests import OpenRLHF normally.
    saved = {
        k: v for k, v in sys.modules.items() if k == "openrlhf.models" or k.startswith("openrlhf.models.")
    }
    sys.path.insert(0, str(BENCH))
    try:
        import loss_cost

        yield loss_cost
    finally:
        sys.path.remove(str(BENCH))
        for k in [k for k in sys.modules if k == "openrlhf.models" or k.startswith("openrlhf.models.")]:
            del sys.modules[k]
        sys.modules.update(saved)
        sys.modules.pop("loss_cost", None)


@pytest.mark.parametrize("pair", ["old", "ref"])
def test_both_sides_compute_the_same_loss(loss_cost, pair):
    from rpg_openrlhf.core import LossConfig, compute_loss

    PolicyLoss, compute_approx_kl, aggregate_loss, _ = loss_cost.load_openrlhf_loss()
    x = loss_cost.make_inputs(4, 256, torch.float32, "cpu")
    base = x["old"] if pair == "old" else x["ref"]
    beta, c = 0.05, 10.0
    policy = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=c)
    actor_loss, *_ = policy(x["logp"], x["old"], x["adv"], action_mask=x["mask"])
    kl = compute_approx_kl(x["logp"], base, log_probs_old=x["old"], kl_estimator="k3")
    theirs = actor_loss + aggregate_loss(kl, x["mask"]) * beta
    cfg = LossConfig(beta=beta, eps_low=0.2, eps_high=0.28, clip_c=c)
    ref = None if pair == "old" else x["ref"]
    ours, _ = compute_loss("grpo_kl", "differentiable", x["logp"], x["old"], x["adv"], x["mask"], ref, cfg)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    g_ours, g_theirs = (torch.autograd.grad(v, x["logp"])[0] for v in (ours, theirs))
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-8)


def test_tiny_run_reports_every_variant_and_pair(loss_cost, tmp_path):
    out = loss_cost.main(
        ["--batch", "2", "--tokens", "64", "--repeats", "1", "--json", str(tmp_path / "r.json")]
    )
    from rpg_openrlhf.core import LOSSES

    paper = {f"{n}/{s}" for n, s in LOSSES if not s.endswith("_released")}
    assert {(r["variant"], r["pair"]) for r in out["rows"]} == {(v, p) for v in paper for p in ("old", "ref")}
    assert all(r["mem_ratio"] > 0 and r["time_ratio"] > 0 for r in out["rows"])
    assert (tmp_path / "r.json").is_file()
