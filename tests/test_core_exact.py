"""Exact-gradient proofs on a policy small enough to enumerate every sequence.

Vocabulary 3, length 3 (27 sequences), tabular logits per prefix, float64. Expectations under
pi_old are exact sums over all sequences weighted by pi_old; the target gradients come from
autograd through the exact objective J = E_theta[R] - beta D(pi_theta, pi_ref), with D computed
by enumeration directly from the probabilities (not from the module's formulas).
"""

import itertools

import pytest
import torch

from rpg_openrlhf.core import LossConfig, token_losses

F64 = torch.float64

V, L = 3, 3
SEQS = torch.tensor(list(itertools.product(range(V), repeat=L)))  # [27, L]
N_PREFIX = sum(V**t for t in range(L))  # 13 prefixes: one logit row each


def _prefix_index() -> torch.Tensor:
    idx, offset = torch.zeros_like(SEQS), 0
    for t in range(L):
        code = torch.zeros(len(SEQS), dtype=torch.long)
        for s in range(t):
            code = code * V + SEQS[:, s]
        idx[:, t] = offset + code
        offset += V**t
    return idx


PREFIX = _prefix_index()
BETA = 0.3
DIVS = ("fkl", "rkl", "ufkl", "urkl")
# Wide windows: nothing clips (w of a sequence stays in (0, 1001), dual bound 1e4 never reached).
STYLES = {
    "differentiable_unclipped": ("differentiable", dict(clip_reward=False)),
    "differentiable_wide": ("differentiable", dict(eps_low=1.0, eps_high=1e3, clip_c=1e4)),
    "reinforce": ("reinforce", {}),
    "reinforce_clip_wide": ("reinforce_clip", dict(eps_low=1.0, eps_high=1e3, clip_c=1e4)),
}


def token_logp(theta: torch.Tensor) -> torch.Tensor:
    """[27, L] per-token log pi(o_t | prefix) of every sequence."""
    return theta[PREFIX].log_softmax(-1).gather(-1, SEQS.unsqueeze(-1)).squeeze(-1)


def exact_divergence(name: str, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """D(pi_theta, pi_ref) by enumeration; p = pi_theta, q = pi_ref over whole sequences."""
    p, q = logp.exp(), logq.exp()
    return {
        "fkl": (q * (logq - logp)).sum(),
        "rkl": (p * (logp - logq)).sum(),
        "ufkl": (q * (logq - logp) - q + p).sum(),
        "urkl": (p * (logp - logq) - p + q).sum(),
    }[name]


@pytest.fixture(scope="module")
def params() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    old = 0.8 * torch.randn(N_PREFIX, V, generator=g, dtype=F64)
    return {
        "old": old,
        "theta": old + 0.4 * torch.randn(N_PREFIX, V, generator=g, dtype=F64),
        "ref": old + 0.4 * torch.randn(N_PREFIX, V, generator=g, dtype=F64),
        "reward": torch.randn(len(SEQS), generator=g, dtype=F64),
    }


def exact_grad(
    name: str | None, theta: torch.Tensor, ref: torch.Tensor, reward: torch.Tensor
) -> torch.Tensor:
    """grad of the loss -J = -(E_theta[R] - beta D(pi_theta, pi_ref)); name=None: reward only."""
    th = theta.clone().requires_grad_()
    logp = token_logp(th).sum(-1)
    objective = (logp.exp() * reward).sum()
    if name is not None:
        objective = objective - BETA * exact_divergence(name, logp, token_logp(ref).sum(-1))
    return torch.autograd.grad(-objective, th)[0]


def surrogate_grad(
    name: str,
    style: str,
    theta: torch.Tensor,
    old: torch.Tensor,
    ref: torch.Tensor | None,
    adv: torch.Tensor,
    **cfg: object,
) -> torch.Tensor:
    """grad of E_old[L] with sequence-level weights, the expectation an exact pi_old-weighted sum."""
    th = theta.clone().requires_grad_()
    old_logp = token_logp(old)
    ref_logp = None if ref is None else token_logp(ref)
    config = LossConfig(beta=BETA, weight_level="sequence", **cfg)
    loss, mask, _ = token_losses(name, style, token_logp(th), old_logp, adv, None, ref_logp, config)
    assert loss.shape == mask.shape == (len(SEQS), 1)
    expectation = (old_logp.sum(-1).exp() * loss.squeeze(-1)).sum()
    return torch.autograd.grad(expectation, th)[0]


@pytest.mark.parametrize("baseline", [0.0, 0.7])
@pytest.mark.parametrize("ref_kind", ["old", "other"])
@pytest.mark.parametrize("policy", ["off", "on"])
@pytest.mark.parametrize("style_key", list(STYLES))
@pytest.mark.parametrize("name", DIVS)
def test_surrogate_gradient_is_exact(name, style_key, policy, ref_kind, baseline, params):
    old = params["old"]
    theta = params["theta"] if policy == "off" else old
    ref = params["ref"] if ref_kind == "other" else old
    style, cfg = STYLES[style_key]
    adv = params["reward"] - baseline  # A = R - b, broadcast over tokens from [B]
    got = surrogate_grad(name, style, theta, old, None if ref_kind == "old" else ref, adv, **cfg)
    want = exact_grad(name, theta, ref, params["reward"])
    assert (got - want).abs().max() < 1e-10
    # Not a vacuous match: the gradient is sizeable and the KL part changes it.
    assert want.norm() > 0.1
    if not (policy == "on" and ref_kind == "old"):  # at theta = pi_ref every divergence is stationary
        assert (want - exact_grad(None, theta, ref, params["reward"])).norm() > 1e-2


WIDE = dict(eps_low=1.0, eps_high=1e3)


@pytest.mark.parametrize("ref_kind", ["old", "other"])
def test_grpo_kl_matches_no_divergence_off_policy(ref_kind, params):
    old, theta = params["old"], params["theta"]
    ref = params["ref"] if ref_kind == "other" else old
    got = surrogate_grad("grpo_kl", "differentiable", theta, old, None if ref_kind == "old" else ref,
                         params["reward"], **WIDE)  # fmt: skip
    for name in DIVS:
        assert (got - exact_grad(name, theta, ref, params["reward"])).abs().max() > 1e-3, name


def test_grpo_kl_is_forward_kl_on_policy(params):
    old, ref = params["old"], params["ref"]
    got = surrogate_grad("grpo_kl", "differentiable", old, old, ref, params["reward"], **WIDE)
    want = exact_grad("fkl", old, ref, params["reward"])
    assert (got - want).abs().max() < 1e-10
    assert (want - exact_grad("rkl", old, ref, params["reward"])).abs().max() > 1e-3  # not vacuous


@pytest.mark.parametrize("ref_kind", ["old", "other"])
def test_corrected_grpo_kl_is_urkl(ref_kind, params):
    old, theta = params["old"], params["theta"]
    ref = params["ref"] if ref_kind == "other" else old
    got = surrogate_grad("grpo_kl_corrected", "differentiable", theta, old, None if ref_kind == "old" else ref,
                         params["reward"], **WIDE)  # fmt: skip
    assert (got - exact_grad("urkl", theta, ref, params["reward"])).abs().max() < 1e-10
