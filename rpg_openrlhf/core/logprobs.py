"""Per-token log-probs (and a detached entropy) from hidden states, without the ``[N, V]`` logits.

The computation is the one OpenRLHF 0.11.2's ``Actor.forward`` does (``openrlhf/models/actor.py``
and ``models/utils.py``: the LM head in the model's dtype, the logits cast to fp32, divided by the
temperature, a log-softmax, the sampled token's entry), for each token row i:

    z_i      = float32(h_i W^T + b) / T                      (the head in the weights' dtype)
    logp_i   = z_i[y_i] - logsumexp(z_i)
    H_i      = logsumexp(z_i) - sum_v softmax(z_i)_v z_iv      (detached; same z as the log-probs)

but a chunk of rows at a time, so that no ``[N, V]`` tensor exists: the forward keeps only ``h``,
``y`` and ``lse_i = logsumexp(z_i)`` for the backward, which recomputes the logits a block of the
vocabulary at a time (all N rows x ``Vb`` columns) and, with ``p = exp(z - lse)``,

    d logp_i / d z_i    = onehot(y_i) - p_i
    d L / d logits_i    = g_i (onehot(y_i) - p_i) / T          cast to the weights' dtype (the
                                                                fp32 cast's backward, as upstream)
    grad h   = sum over vocabulary blocks of  dlogits[:, Vb] W[Vb]   (accumulated in fp32)
    grad W[Vb] = dlogits[:, Vb]^T h       (one product per block: each row of W rounded once)
    grad b[Vb] = sum_i dlogits[i, Vb]

Chunk size rule (:func:`chunk_tokens_for`): a chunk holds ``chunk_tokens x V`` logits; per logit it
costs the head's output in the weights' dtype, its fp32 copy and, in the backward, the gradient in
the weights' dtype (``4 + 2 x itemsize`` bytes), so ``chunk_tokens = budget / (V (4 + 2 itemsize))``.
The backward's vocabulary block has the same element count: ``Vb = chunk_tokens x V / N``.
"""

from __future__ import annotations

import torch

#: Default byte budget of one chunk's logits temporaries (fp32 copy, head output, gradient).
DEFAULT_BUDGET_BYTES = 256 * 2**20


def chunk_tokens_for(vocab: int, dtype: torch.dtype, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> int:
    """Tokens per chunk whose logits temporaries fit ``budget_bytes`` (module docstring), at least 1."""
    if vocab <= 0:
        raise ValueError(f"chunk_tokens_for: vocab must be positive, got {vocab}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    return max(1, int(budget_bytes) // (vocab * (4 + 2 * itemsize)))


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float):
    """fp32 logits / T of some rows (or of some vocabulary rows of ``weight``): upstream's order of
    operations (head in the weights' dtype, fp32 cast, then the division)."""
    z = torch.nn.functional.linear(hidden, weight, bias).float()
    if temperature != 1.0:
        z.div_(temperature)
    return z


class _ChunkedLogProbs(torch.autograd.Function):
    """logp (differentiable in hidden, weight, bias) and a detached entropy, chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk_tokens, with_entropy):
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n, dtype=torch.float32, device=hidden.device) if with_entropy else None
        for s in range(0, n, chunk_tokens):
            e = min(n, s + chunk_tokens)
            z = _logits(hidden[s:e], weight, bias, temperature)
            # logsumexp by hand, so that one [c, V] temporary besides z exists (torch.logsumexp
            # makes its own, and the entropy would need a third): ez = exp(z - max), then ez z
            top = z.amax(dim=-1, keepdim=True)
            ez = (z - top).exp_()
            total = ez.sum(-1)
            lse_c = top[:, 0] + total.log()
            lse[s:e] = lse_c
            logp[s:e] = z.gather(-1, labels[s:e, None])[:, 0] - lse_c
            if entropy is not None:  # H = lse - sum_v softmax(z)_v z_v
                entropy[s:e] = lse_c - ez.mul_(z).sum(-1) / total
            del z, ez
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.temperature, ctx.chunk_tokens, ctx.vocab = temperature, chunk_tokens, weight.shape[0]
        if entropy is None:
            entropy = torch.empty(0, dtype=torch.float32, device=hidden.device)
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n, vocab, temperature = hidden.shape[0], ctx.vocab, ctx.temperature
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        grad_b = torch.empty_like(bias) if need_b else None
        if grad_w is not None and n == 0:
            grad_w.zero_()
        if grad_b is not None and n == 0:
            grad_b.zero_()
        g = grad_logp.float()
        block = max(1, min(vocab, ctx.chunk_tokens * vocab // max(n, 1)))
        rows = torch.arange(n, device=hidden.device)
        for s in range(0, vocab if n else 0, block):
            e = min(vocab, s + block)
            z = _logits(hidden, weight[s:e], None if bias is None else bias[s:e], temperature)
            # dz = g (onehot - p) / T, in place of z
            dz = z.sub_(lse[:, None]).exp_().mul_(-(g / temperature)[:, None])
            inside = (labels >= s) & (labels < e)
            dz[rows[inside], labels[inside] - s] += g[inside] / temperature
            dlogits = dz.to(weight.dtype)
            del z, dz
            if need_h:  # each block's product in the weights' dtype, summed in fp32
                grad_h.add_(dlogits @ weight[s:e])
            if need_w:
                grad_w[s:e] = dlogits.t() @ hidden
            if need_b:
                grad_b[s:e] = dlogits.sum(0)
        return (None if grad_h is None else grad_h.to(hidden.dtype)), grad_w, grad_b, None, None, None, None


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row log-prob of ``labels`` under the head ``weight`` (``[V, H]``) applied to ``hidden``
    (``[N, H]``), and with ``with_entropy`` the detached entropy: both fp32 ``[N]`` (module docstring).

    ``chunk_tokens`` rows at a time (default: :func:`chunk_tokens_for` of the default budget); the
    backward recomputes the logits by vocabulary blocks, so nothing of size ``N x V`` is kept.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"chunked_logprobs: hidden [N, H] and weight [V, H] expected, got {tuple(hidden.shape)} "
            f"and {tuple(weight.shape)}"
        )
    if labels.shape != hidden.shape[:1]:
        raise ValueError(
            f"chunked_logprobs: labels [N] expected, got {tuple(labels.shape)} for N={hidden.shape[0]}"
        )
    if temperature <= 0:
        raise ValueError(f"chunked_logprobs: temperature must be positive, got {temperature}")
    chunk = chunk_tokens or chunk_tokens_for(weight.shape[0], weight.dtype)
    if chunk < 1:
        raise ValueError(f"chunked_logprobs: chunk_tokens must be >= 1, got {chunk_tokens}")
    logp, entropy = _ChunkedLogProbs.apply(
        hidden, weight, bias, labels.long(), float(temperature), int(chunk), bool(with_entropy)
    )
    return logp, (entropy if with_entropy else None)


__all__ = ["DEFAULT_BUDGET_BYTES", "chunk_tokens_for", "chunked_logprobs"]
