"""The RPG loss with OpenRLHF's dynamic micro-batches (``--train.dynamic_batch_enable``): the gradient
an optimizer step receives is the gradient of the step's one-batch loss, written out here.

``tests/helpers/dynamic_batch_worker.py`` runs 2 gloo ranks through OpenRLHF's own replay buffer
(``setup_dynamic_batch``: token-budget micro-batches, 1-2 sequences and 5 or 4 micro-batches per
step here, one sequence without response tokens), OpenRLHF's ``get_loss_batch_info`` and the
plug-in's ``RPGPolicyLoss`` (RPG-RKL, differentiable, clipped reward term). With dynamic batching
DeepSpeed runs with no gradient-accumulation scaling and OpenRLHF steps the optimizer after the last
micro-batch, so the step's gradient is the sum of its micro-batch gradients, averaged over the ranks.
Expected, from every sequence of the step on both ranks (the loss per token l = PPO(w, A) +
beta w log w, w = pi/pi_old, at theta = 0 where w = 1):

* token-mean:            sum_i sum_t m l / sum_i sum_t m
* seq-mean-token-mean:   mean over sequences with a response token of sum_t m l / n_i
* token-mean, ``--rpg.aggregation_scope micro_batch`` (the released code): sum over the step's
  micro-batches b of (n_b / N) x (token mean of b), n_b its sequences with a response token.

Each within 1e-5 (float32 vs float64); a mean of micro-batch means differs by far more (checked, so
that the normalizer can be caught wrong).
"""

from __future__ import annotations

import json

import pytest
import torch

CASES = ["token-mean:step", "seq-mean-token-mean:step", "token-mean:micro_batch"]
EPS_LOW, EPS_HIGH = 0.2, 0.28


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    from deepspeed_ranks import run_script

    out = tmp_path_factory.mktemp("dynamic_batch") / "results.json"
    run_script("dynamic_batch_worker.py", str(out), *CASES)
    return json.loads(out.read_text())


def token_losses(sample: dict, theta: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and mask of one sequence: dual-window PPO on (w, A) plus beta w log w."""
    mask = torch.tensor(sample["action_mask"], dtype=torch.float64)
    log_w = torch.tensor(sample["features"], dtype=torch.float64) @ theta
    w, adv = torch.exp(log_w), sample["advantage"]
    ppo = torch.maximum(-w * adv, -torch.clamp(w, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
    return ppo + beta * w * log_w, mask


def step_loss(samples: list[dict], batches: list[list[str]], mode: str, theta, beta: float) -> torch.Tensor:
    """The one-batch loss of a step (module docstring), or ``mode="mean_of_means"`` (wrong on purpose)."""
    by_id = {s["id"]: token_losses(s, theta, beta) for s in samples}
    if mode == "token-mean:step":
        return sum((loss * m).sum() for loss, m in by_id.values()) / sum(m.sum() for _, m in by_id.values())
    if mode == "seq-mean-token-mean:step":
        means = [(loss * m).sum() / m.sum() for loss, m in by_id.values() if m.sum() > 0]
        return sum(means) / len(means)
    means, weights = [], []
    for ids in batches:
        n_tokens = sum(by_id[i][1].sum() for i in ids)
        means.append(sum((by_id[i][0] * by_id[i][1]).sum() for i in ids) / n_tokens)
        weights.append(sum(1 for i in ids if by_id[i][1].sum() > 0))
    if mode == "mean_of_means":
        return sum(means) / len(means)
    return sum(w * m for w, m in zip(weights, means)) / sum(weights)


def expected_gradient(case: dict, step: int, mode: str, beta: float) -> torch.Tensor:
    ranks = case
    per_rank = len(ranks[0]["samples"]) // 2  # 2 optimizer steps: contiguous halves of each rank's samples
    samples = [s for r in ranks for s in r["samples"][(step - 1) * per_rank : step * per_rank]]
    batches = [m["ids"] for r in ranks for m in r["micro_batches"] if m["step"] == step]
    assert sorted(i for b in batches for i in b) == sorted(s["id"] for s in samples)  # the step's sequences
    theta = torch.zeros(len(samples[0]["features"][0]), dtype=torch.float64, requires_grad=True)
    step_loss(samples, batches, mode, theta, beta).backward()
    return theta.grad


@pytest.mark.parametrize("case_name", CASES)
def test_step_gradient_is_the_one_batch_loss_gradient(results: dict, case_name: str) -> None:
    case, beta = results["cases"][case_name], results["beta"]
    sizes = {len(m["ids"]) for r in case for m in r["micro_batches"]}
    assert len(sizes) > 1, sizes  # micro-batches of different sizes
    for step in (1, 2):
        got = torch.tensor(case[0]["grads"][str(step)], dtype=torch.float64)
        assert got.tolist() == case[1]["grads"][str(step)]  # both ranks hold the averaged gradient
        want = expected_gradient(case, step, case_name, beta)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        wrong = expected_gradient(case, step, "mean_of_means", beta)
        assert (wrong - want).norm() > 0.05 * want.norm(), (step, wrong, want)


def test_normalizers_are_the_steps_totals_over_both_ranks(results: dict) -> None:
    """batch_num_tokens = the step's response tokens, global_batch_size = its sequences with a
    response token, both over both ranks and not divided by a gradient-accumulation count."""
    case = results["cases"]["token-mean:step"]
    per_rank = len(case[0]["samples"]) // 2
    for step in (1, 2):
        samples = [s for r in case for s in r["samples"][(step - 1) * per_rank : step * per_rank]]
        tokens = sum(sum(s["action_mask"]) for s in samples)
        sequences = sum(1 for s in samples if any(s["action_mask"]))
        for rank in case:
            for m in (m for m in rank["micro_batches"] if m["step"] == step):
                assert (m["batch_num_tokens"], m["global_batch_size"], m["dp_size"]) == (tokens, sequences, 2)
    assert any(not any(s["action_mask"]) for r in case for s in r["samples"])  # an empty response is there
