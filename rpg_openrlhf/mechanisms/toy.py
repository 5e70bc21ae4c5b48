"""An autoregressive policy small enough to enumerate, and the exact quantities built on it.

Sequences have a fixed length ``L`` over a vocabulary of ``V`` tokens (default 4 x 4: 256
sequences). The policy is tabular: one row of ``V`` logits per prefix (85 prefixes by
default), so ``pi(x) = prod_t softmax(logits[prefix(x, t)])[x_t]``. Such a policy can
represent every distribution with full support over the ``V**L`` sequences, so the optimum of
a regularized objective over the simplex is also the optimum over the parameters.

Everything here is *exact* (sums over all sequences) and float64: expected reward, the four
divergences, the analytic optima, and the exact expectation under ``pi_old`` of any per-sample
surrogate. None of it is a training loss; training losses come from ``rpg_openrlhf.core``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

DTYPE = torch.float64


@dataclass(frozen=True)
class Toy:
    """The enumerated sequence space, the prefix table and the (verifiable, 0/1) reward.

    Attributes:
        vocab: vocabulary size V.
        length: sequence length L.
        seqs: [N, L] every sequence, lexicographic order (N = V**L).
        prefix_idx: [N, L] row of the logit table used for token t of each sequence.
        num_prefixes: number of rows of the logit table (sum_{t<L} V**t).
        reward: [N] reward of each sequence.
    """

    vocab: int
    length: int
    seqs: Tensor
    prefix_idx: Tensor
    num_prefixes: int
    reward: Tensor

    @property
    def num_seqs(self) -> int:
        return self.seqs.shape[0]


def make_toy(vocab: int = 4, length: int = 4) -> Toy:
    """Build the toy problem.

    Reward: 1 when the last token equals the sum of the previous tokens mod V, else 0 (a
    "verifier" with a 1/V base rate under a uniform policy; it needs every position right,
    so the KL term, not the reward, decides how mass is spread inside the correct set).
    """
    if vocab < 2 or length < 2:
        raise ValueError(f"vocab and length must be >= 2, got vocab={vocab}, length={length}")
    n = vocab**length
    idx = torch.arange(n)
    # Digit t (most significant first) of the sequence index is token t.
    powers = torch.tensor([vocab ** (length - 1 - t) for t in range(length)])
    seqs = (idx[:, None] // powers[None, :]) % vocab
    # Prefix (x_0..x_{t-1}) read as a base-V number (the index's first t digits), after all shorter prefixes.
    prefix_idx = torch.stack(
        [sum(vocab**j for j in range(t)) + idx // vocab ** (length - t) for t in range(length)], 1
    )
    num_prefixes = sum(vocab**t for t in range(length))
    reward = (seqs[:, -1] == seqs[:, :-1].sum(1) % vocab).to(DTYPE)
    return Toy(vocab, length, seqs, prefix_idx, num_prefixes, reward)


def init_logits(toy: Toy, seed: int) -> Tensor:
    """Random initial logit table [num_prefixes, V] (float64), N(0, 1), deterministic for a seed."""
    return torch.randn(
        toy.num_prefixes, toy.vocab, generator=torch.Generator().manual_seed(seed), dtype=DTYPE
    )


def token_logp(toy: Toy, logits: Tensor, seq_ids: Tensor | None = None) -> Tensor:
    """Per-token log-probabilities [B, L] of the sequences ``seq_ids`` (all when None)."""
    logp_table = torch.log_softmax(logits, dim=-1)
    seqs = toy.seqs if seq_ids is None else toy.seqs[seq_ids]
    pidx = toy.prefix_idx if seq_ids is None else toy.prefix_idx[seq_ids]
    return logp_table[pidx, seqs]


def seq_logp(toy: Toy, logits: Tensor) -> Tensor:
    """Sequence log-probabilities [N] of every sequence."""
    return token_logp(toy, logits).sum(-1)


def sample(toy: Toy, logits: Tensor, n: int, generator: torch.Generator) -> Tensor:
    """Draw ``n`` sequence ids from the policy (exactly autoregressive sampling, done jointly)."""
    probs = seq_logp(toy, logits.detach()).exp()
    return torch.multinomial(probs, n, replacement=True, generator=generator)


# ----------------------------------------------------------------------------------------
# Exact objective and divergences (sequence level, normalized distributions).


def expected_reward(toy: Toy, logp: Tensor) -> Tensor:
    """E_pi[R] from sequence log-probabilities [N]."""
    return (logp.exp() * toy.reward).sum()


def kl(logp_p: Tensor, logp_q: Tensor) -> Tensor:
    """KL(p || q) from sequence log-probabilities [N] (exact)."""
    return (logp_p.exp() * (logp_p - logp_q)).sum()


def ukl(logp_p: Tensor, logp_q: Tensor) -> Tensor:
    """Unnormalized KL: sum p log(p/q) - p + q (equals KL when p and q both sum to 1)."""
    p, q = logp_p.exp(), logp_q.exp()
    return (p * (logp_p - logp_q) - p + q).sum()


def tv(logp_p: Tensor, logp_q: Tensor) -> Tensor:
    """Total variation distance 0.5 * sum |p - q|."""
    return 0.5 * (logp_p.exp() - logp_q.exp()).abs().sum()


def divergence(name: str, logp: Tensor, ref_logp: Tensor) -> Tensor:
    """The divergence D(pi_theta, pi_ref) that RPG's loss ``name`` regularizes, sequence level.

    fkl: KL(ref || theta); rkl: KL(theta || ref); ufkl / urkl: their unnormalized versions.
    """
    fn, reverse = {"fkl": (kl, False), "rkl": (kl, True), "ufkl": (ukl, False), "urkl": (ukl, True)}[name]
    return fn(logp, ref_logp) if reverse else fn(ref_logp, logp)


def prefix_divergence(
    name: str, toy: Toy, logits: Tensor, ref_logits: Tensor, prefix_weight: Tensor
) -> Tensor:
    """Token-level divergence: sum over prefixes h of w(h) * D(pi_theta(.|h), pi_ref(.|h)).

    With ``prefix_weight`` = pi_old(h) (held fixed) this is what a per-token surrogate averaged
    over samples of pi_old estimates; its gradient is the target of token-level weights.
    """
    lp = torch.log_softmax(logits, -1)
    lr = torch.log_softmax(ref_logits, -1)
    p, r = lp.exp(), lr.exp()
    per_prefix = {
        "fkl": (r * (lr - lp)).sum(-1),
        "rkl": (p * (lp - lr)).sum(-1),
        "ufkl": (r * (lr - lp) - r + p).sum(-1),
        "urkl": (p * (lp - lr) - p + r).sum(-1),
    }
    return (prefix_weight * per_prefix[name]).sum()


def prefix_probs(toy: Toy, logits: Tensor) -> Tensor:
    """Probability pi(h) [num_prefixes] of reaching each prefix (the empty prefix has 1)."""
    out = torch.zeros(toy.num_prefixes, dtype=DTYPE)
    lp = token_logp(toy, logits.detach())
    # pi(prefix of length t) = exp(sum of the first t token log-probs); every sequence that
    # shares the prefix gives the same value, so index_copy (last write wins) is exact.
    cum = torch.cat([torch.zeros(toy.num_seqs, 1, dtype=DTYPE), lp.cumsum(-1)[:, :-1]], dim=1)
    out[toy.prefix_idx.reshape(-1)] = cum.exp().reshape(-1)
    return out


# ----------------------------------------------------------------------------------------
# Analytic optima of E_pi[R] - beta * D(pi, pi_ref) over the simplex of sequences.


def rkl_optimum(toy: Toy, ref_logp: Tensor, beta: float) -> Tensor:
    """log pi* for the reverse KL: pi* proportional to pi_ref * exp(R / beta) (closed form)."""
    z = ref_logp + toy.reward / beta
    return z - torch.logsumexp(z, 0)


def fkl_optimum(toy: Toy, ref_logp: Tensor, beta: float, iters: int = 200) -> Tensor:
    """log pi* for the forward KL: maximize E_pi[R] - beta KL(pi_ref || pi).

    Stationarity on the simplex gives pi(x) = beta pi_ref(x) / (lam - R(x)) with the scalar lam >
    max R fixed by sum pi = 1; the sum is decreasing in lam, so bisection finds it to machine
    precision.
    """
    ref = ref_logp.exp()
    r_max = float(toy.reward.max())
    lo, hi = r_max + 1e-15, r_max + beta + 1.0  # sum(lo) >= 1 (diverges), sum(hi) <= beta/(beta+1)<1

    def total(lam: float) -> float:
        return float((beta * ref / (lam - toy.reward)).sum())

    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total(mid) > 1.0 else (lo, mid)
    lam = 0.5 * (lo + hi)
    p = beta * ref / (lam - toy.reward)
    return torch.log(p / p.sum())
