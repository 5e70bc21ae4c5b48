"""--rpg.kl_value_clamp, --rpg.kl_rho, --rpg.aggregation_scope and the released styles through
rpg-train's real parser (--dry-run, in-process) and the RPG actor's loss with OpenRLHF's own
per-step normalizers; the expected numbers are formulas written here (the released verl code)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_rpg_flags import dry_run as _flags_dry_run
from test_rpg_flags import dry_run_error


def dry_run(argv: list[str], capsys: pytest.CaptureFixture) -> dict:
    """The ``rpg`` part of ``rpg-train ARGV --dry-run`` (test_rpg_flags' command line)."""
    return _flags_dry_run(argv, capsys)["rpg"]


def test_released_options_resolve_into_the_loss_config(capsys):
    released = ["--rpg.kl_value_clamp", "10", "--rpg.kl_rho", "off", "--rpg.aggregation_scope", "micro_batch"]
    cfg = dry_run(["--rpg.loss", "urkl", *released], capsys)["loss_config"]
    assert (cfg["kl_value_clamp"], cfg["kl_rho"], cfg["aggregation_scope"]) == (10.0, False, "micro_batch")
    default = dry_run(["--rpg.loss", "urkl"], capsys)["loss_config"]  # the paper's text
    assert (default["kl_value_clamp"], default["kl_rho"], default["aggregation_scope"]) == (
        None,
        True,
        "step",
    )
    clip = dry_run(["--rpg.loss", "rkl", "--rpg.style", "reinforce_clip_released"], capsys)["loss_config"]
    assert clip["clip_c"] == 10.0  # the released training config's clip_ratio_c


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.kl_value_clamp", "10"],
         "--rpg.kl_value_clamp"),
        (["--rpg.loss", "urkl", "--rpg.kl_value_clamp", "0"], "--rpg.kl_value_clamp"),
        (["--rpg.loss", "urkl", "--rpg.kl_value_clamp", "nan"], "--rpg.kl_value_clamp"),
        (["--rpg.loss", "urkl", "--rpg.kl_rho", "maybe"], "--rpg.kl_rho"),
        (["--rpg.loss", "urkl", "--rpg.aggregation_scope", "rank"], "--rpg.aggregation_scope"),
        (["--rpg.aggregation_scope", "micro_batch"], "--rpg.aggregation_scope"),  # RPG off
    ],
)  # fmt: skip
def test_invalid_released_options_name_the_flag(argv, named, capsys):
    err = dry_run_error(argv, capsys)
    assert named in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def actor_loss():
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()  # openrlhf.trainer.ray imports vllm / flash_attn at import time
    from rpg_openrlhf.plugin.actor import RPGPolicyLoss

    return RPGPolicyLoss


def test_actor_micro_batch_scope_is_the_released_mean_of_micro_batch_means(actor_loss):
    """Two micro-batches of one optimizer step (gas 2, dp 1) with uneven token counts through the
    RPG actor's loss, normalized by OpenRLHF's own per-step normalizers: the step's loss is the
    mean of the two micro-batch token means (verl), not one token mean over the step."""
    from openrlhf.utils.loss_utils import _optimizer_step_loss_norm

    args = SimpleNamespace(
        rpg=SimpleNamespace(loss="urkl", style="reinforce", beta=0.5, aggregation_scope="micro_batch"),
        actor=SimpleNamespace(eps_clip_low_high=[0.2, 0.28], loss_agg_mode="token-mean"),
    )
    fn = actor_loss.from_args(args)
    assert fn.config.aggregation_scope == "micro_batch"
    g = torch.Generator().manual_seed(0)
    mbs = []
    for lengths in ([2, 3], [9, 8]):
        old = -torch.rand(2, 9, generator=g, dtype=torch.float64)
        logp = (old + 0.3 * torch.randn(2, 9, generator=g, dtype=torch.float64)).requires_grad_()
        adv = torch.randn(2, 1, generator=g, dtype=torch.float64).expand(2, 9)
        mask = (torch.arange(9) < torch.tensor(lengths)[:, None]).to(torch.float64)
        mbs.append((logp, old, adv, mask))
    gas = 2
    info = _optimizer_step_loss_norm([m for *_, m in mbs], None, 1, gas)
    got = sum(fn(logp, old, adv, action_mask=mask, **info)[0] / gas for logp, old, adv, mask in mbs)

    def token_mean(logp, old, adv, mask):  # URKL REINFORCE: -SG(w (A - beta log w)) log pi_theta
        log_w = (logp - old).detach()
        per_token = -(log_w.exp() * (adv - 0.5 * log_w)) * logp
        return (per_token * mask).sum() / mask.sum()

    want = sum(token_mean(*mb) for mb in mbs) / 2
    torch.testing.assert_close(got, want)
    one_mean = sum(token_mean(*mb) * mb[3].sum() for mb in mbs) / sum(mb[3].sum() for mb in mbs)
    assert not math.isclose(float(got), float(one_mean), rel_tol=1e-3)  # the paper's (OpenRLHF's) step mean
