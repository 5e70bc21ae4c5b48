"""The core losses on non-finite and extreme inputs: NaN / inf log-probs or advantages raise a clear
ValueError naming the argument, for every registered loss, instead of a silent NaN loss; extreme but
finite inputs stay finite; a fully masked batch raises (its own mean is 0/0) or, with the step's
normalizers, adds exactly 0."""

from __future__ import annotations

import math

import pytest
import torch

# --------------------------------------------------------------------------- non-finite inputs


def _inputs(seed: int = 0, b: int = 3, t: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 2 - 0.1
    return {
        "logp": (old + 0.1 * torch.randn(b, t, generator=g)).requires_grad_(True),
        "old_logp": old,
        "advantages": torch.randn(b, t, generator=g),
        "ref_logp": old + 0.05 * torch.randn(b, t, generator=g),
        "action_mask": torch.ones(b, t, dtype=torch.bool),
    }


def _variants() -> list[tuple[str, str]]:
    from rpg_openrlhf.core import LOSSES

    return sorted(LOSSES)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("arg", ["logp", "old_logp", "advantages", "ref_logp"])
def test_non_finite_inputs_raise_naming_the_argument(arg: str, bad: float) -> None:
    from rpg_openrlhf.core import LossConfig, compute_loss, token_losses

    for weight_level in ("token", "sequence"):
        cfg = LossConfig(weight_level=weight_level, clip_c=3.0)
        for name, style in _variants():
            x = _inputs()
            with torch.no_grad():
                x[arg][1, 2] = bad
            for fn in (compute_loss, token_losses):
                with pytest.raises(ValueError, match=rf"\b{arg}\b.*(NaN|nan|inf)"):
                    fn(name, style, config=cfg, **x)


#: Framework KL options whose framework has no clamp on these inputs: each computes what its framework
#: does, its own clamps and no others (issue 39), so it overflows where the framework does (TRL's and
#: slime's k3 and w-weighted forms, verl's k2 value, OpenRLHF's unbiased gradient at 3e38, whose own
#: loss is NaN there). tests/test_kl_options.py and tests/test_conformance.py hold their arithmetic.
OVERFLOW_AS_UPSTREAM = {"trl_k3", "trl_k3_bias_corrected", "deepseek_v32_k3", "slime_k3_unbiased",
                        "slime_k1_unbiased", "verl_k2", "openrlhf_k3_unbiased_gradient"}  # fmt: skip


@pytest.mark.parametrize("scale", [1e4, 1e30, 3e38])
def test_extreme_finite_inputs_give_finite_loss_and_gradient(scale: float) -> None:
    """Huge log-ratios are clamped (|log w| <= 20): no inf/NaN in loss, metrics or gradient."""
    from rpg_openrlhf.core import LossConfig, compute_loss

    for weight_level in ("token", "sequence"):
        cfg = LossConfig(weight_level=weight_level, clip_c=3.0)
        for name, style in _variants():
            if name in OVERFLOW_AS_UPSTREAM:
                continue
            x = _inputs()
            with torch.no_grad():
                x["logp"][0, 0] = -scale
                x["logp"][1, 1] = 0.0
                x["old_logp"][1, 1] = -scale
                x["ref_logp"][2, 2] = -scale
                x["advantages"][2] = scale / 1e30  # large but finite advantages
            loss, metrics = compute_loss(name, style, config=cfg, **x)
            loss.backward()
            assert torch.isfinite(x["logp"].grad).all(), (name, style, weight_level, scale)
            assert all(math.isfinite(v) for k, v in metrics.items() if k != "kl"), (name, style, metrics)
            if style.endswith("_released") and scale > 1e30:
                # The released REINFORCE value is -SG(coef) log pi with coef >= (1 - eps_low) A (the
                # weight is hard-clipped, it never shrinks): |log pi| = 3e38 can overflow float32 in
                # the value, as in the released code; the gradient (coef) stays finite (checked above).
                continue
            assert torch.isfinite(loss), (name, style, weight_level, scale)


@pytest.mark.parametrize("scope", ["step", "micro_batch"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_fully_masked_batch_is_not_a_silent_nan(aggregation: str, scope: str) -> None:
    """All tokens masked. Alone (no normalizers) its mean is 0/0: a ValueError naming action_mask,
    never NaN or a made-up number. As one micro-batch of a step (OpenRLHF's normalizers) it adds
    exactly 0 with a zero gradient: the step's mean over its other tokens is untouched."""
    from rpg_openrlhf.core import LossConfig, compute_loss

    cfg = LossConfig(aggregation=aggregation, aggregation_scope=scope, clip_c=3.0)
    for name, style in _variants():
        x = _inputs()
        x["action_mask"] = torch.zeros_like(x["action_mask"])
        with pytest.raises(ValueError, match=r"^action_mask: every token is masked"):
            compute_loss(name, style, config=cfg, **x)
        loss, _ = compute_loss(
            name, style, config=cfg, dp_size=2, batch_num_tokens=7.0, global_batch_size=3.0, **x
        )
        (grad,) = torch.autograd.grad(loss, x["logp"])
        assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad)), (name, style)
