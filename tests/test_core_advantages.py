"""Group baselines (hand-computed values) and their broadcast to tokens."""

import math

import pytest
import torch

from rpg_openrlhf.core import broadcast_to_tokens, group_advantages

# Two prompts, 4 samples each; 0/1 rewards for prompt 0, +-1 for prompt 1.
R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, -1.0, 1.0])


def test_mean_baseline():
    want = [0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -1.5, 0.5]
    assert group_advantages(R, 4, "mean").tolist() == want


def test_mean_std_baseline_uses_unbiased_std_plus_1e9():
    std0, std1 = math.sqrt(1 / 3), 1.0  # sqrt(sum (r - mean)^2 / (n - 1)): 1/3 and 3/3
    want = [0.5 / std0, -0.5 / std0, -0.5 / std0, 0.5 / std0, 0.5 / std1, 0.5 / std1, -1.5 / std1, 0.5 / std1]
    got = group_advantages(R, 4, "mean_std")
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-6, atol=0)
    # an all-equal group stays finite (std 0 -> divided by 1e-9 of a zero numerator)
    assert group_advantages(torch.ones(3), 3, "mean_std").tolist() == [0.0, 0.0, 0.0]


def test_leave_one_out_baseline():
    # sample 0 of prompt 0: 1 - (0 + 0 + 1) / 3 = 2/3; sample 2 of prompt 1: -1 - 3/3 = -2
    want = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 2 / 3, 2 / 3, -2.0, 2 / 3])
    torch.testing.assert_close(group_advantages(R, 4, "loo"), want)
    # loo = n / (n - 1) * mean-baseline advantage
    torch.testing.assert_close(group_advantages(R, 4, "loo"), group_advantages(R, 4, "mean") * 4 / 3)


def test_no_baseline_returns_a_copy():
    got = group_advantages(R, 4, "none")
    assert torch.equal(got, R) and got.data_ptr() != R.data_ptr()


def test_broadcast_to_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    got = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert got.tolist() == [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    "args, arg",
    [
        ((R, 4, "median"), "baseline"),
        ((R, 3, "mean"), "n_samples"),
        ((R, 0, "mean"), "n_samples"),
        ((R, 1, "loo"), "n_samples"),
        ((R, 1, "mean_std"), "n_samples"),
        ((R.reshape(2, 4), 4, "mean"), "rewards"),
    ],
)
def test_bad_input_names_the_argument(args, arg):
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        group_advantages(*args)


def test_broadcast_shape_mismatch():
    with pytest.raises(ValueError, match=r"^advantages:"):
        broadcast_to_tokens(torch.ones(3), torch.ones(2, 4))
