"""``--ds.packing_samples`` runs on CPU: OpenRLHF's packed ``Actor.forward`` equals the padded one.

OpenRLHF 0.11.2 packs inside ``Actor.forward``: ``unpad_and_slice_tensor`` (flash_attn.bert_padding's
helpers: the CPU backend's stand-ins) turns a right-padded ``[B, T]`` batch into one ``[1, N]`` row
with position ids that restart at 0 for every sequence and no attention mask; on a GPU
flash-attention's varlen kernel keeps the sequences apart. On CPU with sdpa, transformers builds a
block-diagonal causal mask from those position ids (``masking_utils.find_packed_sequence_indices``).
Checked here on the tiny bf16 model, sequences of different lengths and prompts, action masks as
OpenRLHF builds them:

* the packed log-probs of every response token equal the padded forward's (within 1e-4), and the
  RPG loss's gradient of every parameter equals it (relative 1e-2, bf16);
* the check can fail: without the boundary detection the later sequences attend to the earlier
  ones and their log-probs move by more than 0.05.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

LENGTHS, PROMPT = [21, 7, 13, 11], 3


@pytest.fixture(scope="module")
def actors(tiny_model_dir: Path):
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from openrlhf.models import Actor

    packed = Actor(str(tiny_model_dir), attn_implementation="sdpa", param_dtype="bf16", packing_samples=True)
    padded = Actor(str(tiny_model_dir), attn_implementation="sdpa", param_dtype="bf16", packing_samples=False)
    padded.model.load_state_dict(packed.model.state_dict())
    return packed, padded


def right_padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequences, attention mask, action mask ([B, T - 1]: the response tokens each log-prob is of)."""
    torch.manual_seed(0)
    b, t = len(LENGTHS), max(LENGTHS)
    attention = torch.zeros(b, t, dtype=torch.long)
    action = torch.zeros(b, t - 1, dtype=torch.bool)
    for i, n in enumerate(LENGTHS):
        attention[i, :n] = 1
        action[i, PROMPT - 1 : n - 1] = True
    return torch.randint(3, vocab, (b, t)) * attention, attention, action


def rpg_loss_grads(actor, seq, attention, action) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    from rpg_openrlhf import core

    actor.zero_grad(set_to_none=True)
    logp = actor(seq, action, attention_mask=attention)
    old = logp.detach() - 0.1 * action.float()
    adv = torch.linspace(-1, 1, len(LENGTHS))[:, None] * action.float()
    loss, _ = core.compute_loss(
        "rkl", "differentiable", logp, old, adv, action, config=core.LossConfig(beta=0.5)
    )
    loss.backward()
    return logp.detach(), {
        n: p.grad.float().clone() for n, p in actor.named_parameters() if p.grad is not None
    }


def test_packed_forward_and_gradient_equal_the_padded(actors) -> None:
    packed, padded = actors
    seq, attention, action = right_padded_batch(packed.model.config.vocab_size)
    logp_packed, grads_packed = rpg_loss_grads(packed, seq, attention, action)
    logp_padded, grads_padded = rpg_loss_grads(padded, seq, attention, action)
    assert int(action.sum()) == sum(n - PROMPT for n in LENGTHS)
    torch.testing.assert_close(logp_packed[action], logp_padded[action], rtol=0, atol=1e-4)
    assert grads_packed.keys() == grads_padded.keys() and grads_packed
    for name, grad in grads_padded.items():
        err = (grads_packed[name] - grad).norm() / grad.norm().clamp(min=1e-12)
        assert err < 1e-2, (name, float(err))


def test_without_sequence_boundaries_the_log_probs_differ(actors, monkeypatch) -> None:
    import transformers.masking_utils as masking

    packed, padded = actors
    seq, attention, action = right_padded_batch(packed.model.config.vocab_size)
    with torch.no_grad():
        reference = padded(seq, action, attention_mask=attention)
        monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)
        crossing = packed(seq, action, attention_mask=attention)
    gap = ((crossing - reference).abs() * action).amax(dim=1)
    assert float(gap[0]) < 1e-4  # the first sequence sees nothing before it either way
    assert bool((gap[1:] > 0.05).all()), gap
