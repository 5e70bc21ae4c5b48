"""``rpg_openrlhf.core.logprobs``: chunked log-probs, their gradients and the detached entropy equal the
full-vocabulary computation written here in float64; the chunk rule; the memory the launch plan's
``chunked_training_bytes`` term says (measured: c10's CPU allocator, ``bench/benchlib.peak_cpu_bytes``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from rpg_openrlhf.core.logprobs import chunk_tokens_for, chunked_logprobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def full(hidden, weight, bias, labels, temperature):
    """The formula in float64 with the whole [N, V] logits."""
    z = torch.nn.functional.linear(hidden.double(), weight.double(), None if bias is None else bias.double())
    z = z / temperature
    logp = z.log_softmax(-1).gather(-1, labels[:, None])[:, 0]
    entropy = torch.logsumexp(z, -1) - (z.softmax(-1) * z).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("chunk", [1, 4, 7, 1000])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_values_and_gradients_equal_the_full_computation(chunk, with_bias, temperature) -> None:
    torch.manual_seed(0)
    n, h, v = 23, 8, 37
    hidden = torch.randn(n, h, requires_grad=True)
    weight = (torch.randn(v, h) * 0.5).requires_grad_()
    bias = torch.randn(v, requires_grad=True) if with_bias else None
    labels = torch.randint(0, v, (n,))
    labels[:3] = torch.tensor([0, v - 1, chunk % v])  # vocabulary edges and a block boundary
    g = torch.randn(n)
    logp, entropy = chunked_logprobs(
        hidden, weight, labels, bias=bias, temperature=temperature, chunk_tokens=chunk, with_entropy=True
    )
    (logp * g).sum().backward()
    got = [t.grad.clone() for t in (hidden, weight, bias) if t is not None]
    for t in (hidden, weight, bias):
        if t is not None:
            t.grad = None
    ref_logp, ref_entropy = full(hidden, weight, bias, labels, temperature)
    (ref_logp * g.double()).sum().backward()
    torch.testing.assert_close(logp.double(), ref_logp.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy.double(), ref_entropy.detach(), rtol=0, atol=1e-5)
    assert not entropy.requires_grad and logp.dtype == torch.float32
    expected = [t.grad for t in (hidden, weight, bias) if t is not None]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_no_tokens() -> None:
    weight = torch.randn(5, 3, requires_grad=True)
    hidden = torch.zeros(0, 3, requires_grad=True)
    logp, entropy = chunked_logprobs(hidden, weight, torch.zeros(0, dtype=torch.long))
    assert logp.shape == (0,) and entropy is None
    logp.sum().backward()
    assert weight.grad is not None and not weight.grad.any()


def test_bad_input_names_what_is_wrong() -> None:
    w = torch.randn(5, 3)
    with pytest.raises(ValueError, match=r"hidden \[N, H\] and weight \[V, H\]"):
        chunked_logprobs(torch.randn(4, 2), w, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels \[N\]"):
        chunked_logprobs(torch.randn(4, 3), w, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature must be positive"):
        chunked_logprobs(torch.randn(4, 3), w, torch.zeros(4, dtype=torch.long), temperature=0)
    with pytest.raises(ValueError, match="vocab must be positive"):
        chunk_tokens_for(0, torch.float32)


def test_chunk_rule() -> None:
    """budget / (V (4 + 2 itemsize)): the head output, its fp32 copy and the gradient per logit."""
    assert chunk_tokens_for(151936, torch.bfloat16) == 256 * 2**20 // (151936 * 8) == 220
    assert chunk_tokens_for(151936, torch.float32, 2**30) == 2**30 // (151936 * 12)
    assert chunk_tokens_for(10**9, torch.float32, 1) == 1


def test_peak_memory_is_the_planned_term() -> None:
    """Forward + backward in bf16 stays within b + 8 N H (launch/memory_terms.py; the head weight's
    gradient is the plan's gradients term, so the weight is frozen here) and uses most of it."""
    from benchlib import peak_cpu_bytes

    from rpg_openrlhf.launch.memory_terms import chunked_training_bytes
    from rpg_openrlhf.launch.model_shape import ModelShape

    n, h, v, budget = 512, 64, 4096, 2**20
    torch.manual_seed(0)
    hidden = torch.randn(n, h, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.bfloat16)
    labels = torch.randint(0, v, (n,))
    chunk = chunk_tokens_for(v, torch.bfloat16, budget)

    def step() -> None:
        logp, _ = chunked_logprobs(hidden, weight, labels, chunk_tokens=chunk, with_entropy=True)
        logp.sum().backward()

    measured = peak_cpu_bytes(step)
    shape = ModelShape(layers=1, hidden=h, intermediate=1, heads=1, kv_heads=1, head_dim=h, vocab=v,
                       tie_word_embeddings=True)  # fmt: skip
    planned = chunked_training_bytes(shape, n, budget)
    assert 0.6 * planned <= measured <= planned, (measured, planned)
