"""k1/k2/k3 and the per-token divergence components (value and score) of core/kl.py."""

import pytest
import torch

from rpg_openrlhf.core import DIVERGENCES, k1, k2, k3, kl_components

F64 = torch.float64
DIVS = ("fkl", "rkl", "ufkl", "urkl")


def test_estimators_pointwise():
    """Values and gradients in log y: k1' = -1, k2' = log y, k3' = y - 1."""
    y = torch.tensor([0.5, 1.0, 3.0], dtype=F64)
    log_y = y.log().requires_grad_()
    for fn, value, grad in (
        (k1, -log_y, -torch.ones_like(y)),
        (k2, log_y**2 / 2, y.log()),
        (k3, y - 1 - log_y, y - 1),
    ):
        got = fn(log_y)
        torch.testing.assert_close(got, value)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), log_y)[0], grad)
    torch.testing.assert_close(k3(log_y, y), y - 1 - log_y)
    assert k3(torch.tensor(0.0)) == 0 and (k3(log_y) >= 0).all()


def test_k1_k3_expectations_over_a_finite_set():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(6, generator=g, dtype=F64).softmax(0)  # sampling distribution
    p = torch.randn(6, generator=g, dtype=F64).exp()  # unnormalized measure: k3 gives UKL exactly
    kl_q_p = (q * (q / p).log()).sum()
    torch.testing.assert_close((q * k1((p / q).log())).sum(), kl_q_p, rtol=0, atol=1e-14)
    torch.testing.assert_close((q * k3((p / q).log())).sum(), kl_q_p - q.sum() + p.sum(), rtol=0, atol=1e-14)


@pytest.mark.parametrize("ref_normalized", [True, False])
@pytest.mark.parametrize("name", DIVS)
def test_components_are_exact_for_unnormalized_measures(name, ref_normalized):
    """E_old[D_t] and its gradient equal D exactly even when pi_theta is an unnormalized measure,
    which separates FKL from UFKL and RKL from URKL (equal for normalized policies)."""
    g = torch.Generator().manual_seed(2)
    log_old = torch.randn(7, generator=g, dtype=F64).log_softmax(0)
    log_theta = (torch.randn(7, generator=g, dtype=F64) + 0.3).requires_grad_()
    log_ref = torch.randn(7, generator=g, dtype=F64)
    log_ref = log_ref.log_softmax(0) if ref_normalized else log_ref
    p, q = log_theta.exp(), log_ref.exp()
    want = {
        "fkl": (q * (log_ref - log_theta)).sum(),
        "rkl": (p * (log_theta - log_ref)).sum(),
        "ufkl": (q * (log_ref - log_theta) - q + p).sum(),
        "urkl": (p * (log_theta - log_ref) - p + q).sum(),
    }[name]
    got = (log_old.exp() * kl_components(name, log_theta, log_old, log_ref)).sum()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    g_got, g_want = (torch.autograd.grad(x, log_theta)[0] for x in (got, want))
    torch.testing.assert_close(g_got, g_want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("with_ref", [True, False])
@pytest.mark.parametrize("name", DIVS)
def test_score_is_the_derivative_of_the_value(name, with_ref):
    g = torch.Generator().manual_seed(3)
    log_w = (0.7 * torch.randn(5, 4, generator=g, dtype=F64)).requires_grad_()
    log_rho = 0.7 * torch.randn(5, 4, generator=g, dtype=F64) if with_ref else None
    rho = log_rho.exp() if with_ref else 1.0
    log_pr = log_w - log_rho if with_ref else log_w
    div = DIVERGENCES[name]
    (autograd_score,) = torch.autograd.grad(div.value(log_pr, log_w.exp(), rho).sum(), log_w)
    score = torch.as_tensor(div.score(log_pr.detach(), log_w.detach().exp(), rho), dtype=F64)
    torch.testing.assert_close(score.expand_as(autograd_score), autograd_score, rtol=0, atol=1e-13)


def test_components_with_ref_equal_to_old_match_none():
    g = torch.Generator().manual_seed(4)
    logp, old = torch.randn(2, 3, generator=g, dtype=F64), torch.randn(2, 3, generator=g, dtype=F64)
    for name in DIVS:
        torch.testing.assert_close(kl_components(name, logp, old, old), kl_components(name, logp, old))


def test_unknown_divergence_names_the_argument():
    with pytest.raises(ValueError, match=r"^name:"):
        kl_components("jsd", torch.zeros(1, 1), torch.zeros(1, 1))
