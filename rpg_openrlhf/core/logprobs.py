"""Per-token log-probs (and a detached entropy) from hidden states, without the ``[N, V]`` logits: the
computation of OpenRLHF 0.11.2's ``Actor.forward`` (the LM head in the weights' dtype, fp32 logits / T,
log-softmax, the sampled token's entry), a chunk of rows at a time:

    z_i = float32(h_i W^T + b) / T,   logp_i = z_i[y_i] - lse_i,   H_i = lse_i - sum_v softmax(z_i)_v z_iv

The forward keeps h, y, lse_i; the backward recomputes the logits a vocabulary block (N x Vb) at a time:
dz_i = g_i (onehot(y_i) - p_i) / T in the weights' dtype, grad h = sum_blocks dz W[Vb] (fp32), grad
W[Vb] = dz^T h, grad b[Vb] = sum_i dz_i. chunk_tokens = budget / (V (4 + 2 itemsize)) (fp32 copy, head
output, gradient), Vb = chunk_tokens V / N. The core's one autograd.Function: 0.029x the peak memory
of full logits (bench/logprob_memory.py)."""

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
    """fp32 logits / T of some rows (or vocabulary rows): upstream's order (head, fp32 cast, division)."""
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
            # logsumexp by hand: one [c, V] temporary besides z (torch.logsumexp makes its own)
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
        new = torch.zeros_like if n == 0 else torch.empty_like  # no rows: zero gradients, no blocks
        grad_w, grad_b = new(weight) if need_w else None, new(bias) if need_b else None
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


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                     bias: torch.Tensor | None = None, temperature: float = 1.0, chunk_tokens: int | None = None,
                     with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Per-row log-prob of ``labels`` under the head ``weight`` [V, H] applied to ``hidden`` [N, H], and
    the detached entropy with ``with_entropy``: fp32 [N]; ``chunk_tokens`` rows at a time (default:
    :func:`chunk_tokens_for` of the default budget)."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"chunked_logprobs: hidden [N, H] and weight [V, H] expected, got {tuple(hidden.shape)} "
                         f"and {tuple(weight.shape)}")  # fmt: skip
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"chunked_logprobs: labels [N] expected, got {tuple(labels.shape)} for N={hidden.shape[0]}")  # fmt: skip
    if temperature <= 0:
        raise ValueError(f"chunked_logprobs: temperature must be positive, got {temperature}")
    chunk = chunk_tokens or chunk_tokens_for(weight.shape[0], weight.dtype)
    if chunk < 1:
        raise ValueError(f"chunked_logprobs: chunk_tokens must be >= 1, got {chunk_tokens}")
    args = (hidden, weight, bias, labels.long(), float(temperature), int(chunk), bool(with_entropy))
    logp, entropy = _ChunkedLogProbs.apply(*args)
    return logp, (entropy if with_entropy else None)
