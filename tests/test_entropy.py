"""Entropy logging without an autograd graph (issue #11 item 6).

The logged entropy equals -sum p log p computed here in float64; on the path OpenRLHF's training
step calls (``openrlhf.models.Actor.forward(return_entropy=True)``) the patched entropy holds no
graph, and one forward saves exactly as many bytes for backward as a forward without entropy
(OpenRLHF's own, differentiable entropy saves one more [B, T, V] float32 tensor: without the patch the
check fails).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rpg_openrlhf.common import seam
from rpg_openrlhf.extras import entropy
from rpg_openrlhf.extras.patches import PATCHES

V, B, T, N_ACTIONS = 4096, 2, 48, 16


def reference_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = -sum_v p_v log p_v, in float64 (written here, not taken from the module under test)."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk_elements", [1, 3 * 50, entropy.CHUNK_ELEMENTS])
def test_entropy_equals_the_formula(chunk_elements: int) -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 50) * torch.tensor([0.1, 3.0, 30.0]).view(3, 1, 1)
    logits[0, 0] = 0.0  # uniform: log 50
    logits.requires_grad_(True)
    h = entropy.entropy_from_logits(logits, chunk_elements=chunk_elements)
    assert h.shape == (3, 7) and h.grad_fn is None and not h.requires_grad
    torch.testing.assert_close(h.double(), reference_entropy(logits.detach()), rtol=1e-5, atol=1e-5)
    assert abs(float(h[0, 0]) - torch.log(torch.tensor(50.0)).item()) < 1e-5


@pytest.fixture
def openrlhf_actor():
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from openrlhf.models import Actor
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    actor = Actor(Qwen2ForCausalLM(config))
    actor.packing_samples = False  # set by Actor for a path, not for a module
    return actor


def _forward(actor, return_entropy: bool) -> tuple[int, object]:
    """One training forward as ActorPPOTrainer.training_step makes it; bytes saved for backward."""
    torch.manual_seed(1)
    sequences = torch.randint(0, V, (B, T))
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, output = actor(
            sequences, torch.ones(B, N_ACTIONS, dtype=torch.bool), attention_mask=torch.ones(B, T, dtype=torch.long),
            return_output=True, return_entropy=return_entropy,
        )  # fmt: skip
    return saved[0], output


def test_actor_forward_logs_the_detached_entropy(openrlhf_actor, monkeypatch) -> None:
    import openrlhf.models.actor as actor_mod

    monkeypatch.setattr(actor_mod, "compute_entropy", actor_mod.compute_entropy)  # restored afterwards
    seam.apply(PATCHES, "entropy-worker")  # what the policy worker does
    without, _ = _forward(openrlhf_actor, return_entropy=False)
    with_entropy, output = _forward(openrlhf_actor, return_entropy=True)
    assert output.entropy.grad_fn is None and not output.entropy.requires_grad
    assert with_entropy == without  # nothing kept for backward on account of the entropy
    torch.testing.assert_close(
        output.entropy.double(), reference_entropy(output["logits"].detach())[:, :-1], rtol=1e-5, atol=1e-5
    )


def _args(coef):
    return SimpleNamespace(actor=SimpleNamespace(entropy_coef=coef))


def test_install_gives_stock_and_rpg_policy_actors_the_mixin(monkeypatch) -> None:
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    import openrlhf.trainer.ray.ppo_actor as ppo_actor_mod

    from rpg_openrlhf.plugin.actor import RPGPolicyModelActor

    for base in (ppo_actor_mod.PolicyModelActor, RPGPolicyModelActor):
        monkeypatch.setattr(ppo_actor_mod, "PolicyModelActor", base)
        for coef in (None, 0.01):
            assert entropy.enable(_args(coef)) is False
            assert ppo_actor_mod.PolicyModelActor is base
        assert entropy.enable(_args(0.0)) is True
        cls = ppo_actor_mod.PolicyModelActor.__ray_actor_class__
        assert issubclass(cls, entropy.LoggedEntropyMixin) and issubclass(cls, base.__ray_actor_class__)
        assert entropy.enable(_args(0.0)) and ppo_actor_mod.PolicyModelActor.__ray_actor_class__ is cls


def test_mixin_patches_only_when_the_entropy_is_logged_only(monkeypatch) -> None:
    import openrlhf.models.actor as actor_mod

    upstream = actor_mod.compute_entropy
    monkeypatch.setattr(actor_mod, "compute_entropy", upstream)

    class Base:
        def init_model_from_pretrained(self, strategy, pretrain):
            return actor_mod.compute_entropy

    class Policy(entropy.LoggedEntropyMixin, Base):
        pass

    assert Policy().init_model_from_pretrained(SimpleNamespace(args=_args(0.5)), "m") is upstream
    assert (
        Policy().init_model_from_pretrained(SimpleNamespace(args=_args(0.0)), "m")
        is entropy.entropy_from_logits
    )
