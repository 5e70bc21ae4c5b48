"""The chunked log-prob path against OpenRLHF 0.11.2's own ``Actor.forward`` on the same weights.

Tiny Qwen2 models (fp32 and bf16, tied and untied heads), OpenRLHF's padded and packed layouts,
temperature 1 and 0.7, the default chunk budget and one that makes a chunk of 3 tokens (every
combination of any four of these five settings):

* the action log-probs equal upstream's (fp32: 2e-6, fp32 rounding; bf16: 1e-5: the two paths run the
  same bf16 head product per token row, then the same fp32 operations);
* the logged entropy equals the formula (written here) on upstream's fp32, temperature-scaled logits
  in upstream's layout (``output.entropy``);
* the gradient of an RPG loss (urkl, REINFORCE style, with a reference) of every parameter equals
  upstream's (error norm over the whole gradient's norm): 1e-5 in fp32; in bf16 1e-2, because the chunked backward rounds each
  vocabulary block's ``dlogits @ W`` product to bf16 before summing them in fp32 where upstream rounds
  one product once (a few bf16 ulps, 2^-8 each, in the hidden states' gradient, carried through the
  bf16 body); the test also checks that bf16 error against the fp64 truth is no larger than 2x upstream's;
* nothing of size ``[N, V]`` is saved for the backward (upstream saves the fp32 logits).
"""

from __future__ import annotations

import pytest
import torch

from rpg_openrlhf.common import logprobs_path as lp

V, PROMPTS, RESPONSES = 97, [3, 5, 2], [6, 2, 4]


@pytest.fixture(scope="module")
def actor_mod():
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    import openrlhf.models.actor as actor_mod

    # upstream's entropy is torch.compile'd (minutes on CPU); the stock forward here gets the same
    # formula eagerly (its value is compared to entropy_formula, not to the chunked path's)
    saved = actor_mod.compute_entropy
    actor_mod.compute_entropy = lambda logits: entropy_formula(logits).float()
    yield actor_mod
    actor_mod.compute_entropy = saved


@pytest.fixture
def stock(actor_mod, monkeypatch):
    """OpenRLHF's Actor.forward (even where a test applied the patch), the one the chunked path falls back to."""
    forward = lp._STATE["original"] or actor_mod.Actor.forward
    assert forward is not lp.chunked_forward
    monkeypatch.setitem(lp._STATE, "original", forward)
    return forward


def make_actor(actor_mod, dtype: torch.dtype, tied: bool, packed: bool, temperature: float):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied,
        attn_implementation="sdpa",
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).to(dtype)
    if not tied:  # a bias-free head of its own, not a copy of the embedding
        assert model.lm_head.weight is not model.model.embed_tokens.weight
    actor = actor_mod.Actor(model, temperature=temperature)
    actor.packing_samples = packed  # set by Actor only when it loads a checkpoint
    return actor


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """OpenRLHF's layout: prompts left-padded, responses right-padded; action mask [B, A]."""
    torch.manual_seed(1)
    p, a = max(PROMPTS), max(RESPONSES)
    b = len(PROMPTS)
    attention = torch.zeros(b, p + a, dtype=torch.long)
    action = torch.zeros(b, a, dtype=torch.bool)
    for i, (np_, na) in enumerate(zip(PROMPTS, RESPONSES)):
        attention[i, p - np_ : p + na] = 1
        action[i, :na] = True
    return torch.randint(3, V, (b, p + a)) * attention, attention, action


def rpg_grads(actor, forward, seq, attention, action):
    """Action log-probs, the entropy and every parameter's gradient of the RPG urkl loss."""
    from rpg_openrlhf import core

    actor.zero_grad(set_to_none=True)
    logp, output = forward(
        actor, seq, action, attention_mask=attention, return_output=True, return_entropy=True
    )
    torch.manual_seed(2)
    old = (logp.detach() - 0.1 * torch.rand_like(logp)) * action
    ref = (logp.detach() + 0.2 * torch.rand_like(logp)) * action
    adv = torch.linspace(-1, 1, len(PROMPTS))[:, None] * action.float()
    loss, _ = core.compute_loss(
        "urkl", "reinforce", logp, old, adv, action, ref.float(), config=core.LossConfig(beta=0.3)
    )
    loss.backward()
    grads = {n: p.grad.double().clone() for n, p in actor.named_parameters() if p.grad is not None}
    return logp.detach(), output, grads


def entropy_formula(logits: torch.Tensor) -> torch.Tensor:
    z = logits.double()
    return torch.logsumexp(z, -1) - (z.softmax(-1) * z).sum(-1)


def _half_fraction() -> list:
    """(chunk tokens, dtype, tied, packed, temperature): the half of the 2^5 grid whose levels' parity
    is even (defining relation I = ABCDE), so every combination of any four of the five settings is run
    once. chunk None: the default budget; 3: a budget that makes 3-token chunks at V (4 + 2 x 4 bytes)."""
    import itertools

    grid = itertools.product(
        [None, 3], [torch.float32, torch.bfloat16], [True, False], [False, True], [1.0, 0.7]
    )
    return [
        pytest.param(*c, id=f"chunk{c[0]}-{str(c[1])[6:]}-{'tied' if c[2] else 'untied'}-"
                     f"{'packed' if c[3] else 'padded'}-{c[4]}")
        for c in grid
        if sum((c[0] == 3, c[1] == torch.bfloat16, not c[2], c[3], c[4] == 0.7)) % 2 == 0
    ]  # fmt: skip


@pytest.mark.parametrize("chunk,dtype,tied,packed,temperature", _half_fraction())
def test_chunked_equals_openrlhf(
    actor_mod, stock, monkeypatch, chunk, dtype, tied, packed, temperature
) -> None:
    if chunk is not None:
        monkeypatch.setitem(lp._STATE, "budget_bytes", chunk * V * 12)
    actor = make_actor(actor_mod, dtype, tied, packed, temperature)
    seq, attention, action = batch()
    logp_s, out_s, grads_s = rpg_grads(actor, stock, seq, attention, action)
    logp_c, out_c, grads_c = rpg_grads(actor, lp.chunked_forward, seq, attention, action)

    atol = 2e-6 if dtype == torch.float32 else 1e-5
    torch.testing.assert_close(logp_c, logp_s, rtol=0, atol=atol)
    assert bool((logp_c[~action] == 0).all()) and bool((logp_c[action] < 0).all())
    # the entropy OpenRLHF's training step logs: output.entropy[:, -A:] under the action mask
    actions = action.shape[1]
    expected = out_s.entropy[:, -actions:].detach().double()  # entropy_formula on upstream's logits
    got = out_c.entropy[:, -actions:]
    assert not got.requires_grad and out_c["logits"] is None
    torch.testing.assert_close(got[action].double(), expected[action], rtol=0, atol=2e-5)

    assert grads_c.keys() == grads_s.keys() and len(grads_s) > 5
    # each parameter's error relative to the whole gradient's norm (a per-parameter ratio is noise over
    # noise where the exact gradient is 0: the key biases, by softmax's shift invariance)
    scale = sum(float(g.norm() ** 2) for g in grads_s.values()) ** 0.5
    bound = 1e-5 if dtype == torch.float32 else 1e-2
    for name, grad in grads_s.items():
        err = float((grads_c[name] - grad).norm()) / scale
        assert err < bound, (name, err)


def test_bf16_gradient_is_as_close_to_the_fp64_truth_as_upstreams(actor_mod, stock, monkeypatch) -> None:
    """The bf16 tolerance above is rounding, not a different gradient: against the same model in fp64
    the chunked path's error is within 2x upstream's own."""
    monkeypatch.setitem(lp._STATE, "budget_bytes", 3 * V * 8)  # 3-token chunks in bf16: many blocks
    seq, attention, action = batch()
    bf16 = make_actor(actor_mod, torch.bfloat16, True, False, 0.7)
    truth = make_actor(actor_mod, torch.float64, True, False, 0.7)
    truth.model.load_state_dict({k: v.double() for k, v in bf16.model.state_dict().items()})
    _, _, g_true = rpg_grads(truth, stock, seq, attention, action)
    _, _, g_stock = rpg_grads(bf16, stock, seq, attention, action)
    _, _, g_chunk = rpg_grads(bf16, lp.chunked_forward, seq, attention, action)
    total = {
        which: sum(float((g[n] - g_true[n]).norm() ** 2) for n in g_true) ** 0.5
        for which, g in (("stock", g_stock), ("chunked", g_chunk))
    }
    assert total["chunked"] <= 2 * total["stock"], total


def test_no_vocabulary_sized_tensor_is_saved_for_backward(actor_mod, stock) -> None:
    actor = make_actor(actor_mod, torch.float32, True, False, 1.0)
    seq, attention, action = batch()
    tokens = seq.numel()

    def vocabulary_sized(forward) -> list[int]:
        """Sizes of the tensors saved for backward with a vocabulary dimension, weights aside."""
        sizes = []
        params = {p.data_ptr() for p in actor.parameters()}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.data_ptr() not in params and V in t.shape:  # V = 97: no other dimension of the model
                sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            forward(actor, seq, action, attention_mask=attention, return_output=True, return_entropy=True)
        return sizes

    assert max(vocabulary_sized(stock)) >= tokens * V  # what the path removes: the fp32 [B, T, V] logits
    assert vocabulary_sized(lp.chunked_forward) == []


def test_calls_the_path_does_not_cover_take_openrlhfs_forward(actor_mod, stock) -> None:
    """No action mask (the logits themselves) and return_logprobs: upstream's forward, unchanged."""
    actor = make_actor(actor_mod, torch.float32, False, False, 1.0)
    seq, attention, action = batch()
    with torch.no_grad():
        out = lp.chunked_forward(actor, seq, attention_mask=attention, return_output=True)
        assert out["logits"].shape == (*seq.shape, V)
        full = lp.chunked_forward(actor, seq, attention_mask=attention, return_logprobs=True)
        assert full.shape == (seq.shape[0], seq.shape[1] - 1)
        torch.testing.assert_close(full, stock(actor, seq, attention_mask=attention, return_logprobs=True))


def test_a_model_that_does_not_return_its_heads_output_is_an_error(actor_mod, stock, monkeypatch) -> None:
    actor = make_actor(actor_mod, torch.float32, False, False, 1.0)
    hf_forward = type(actor.model).forward

    def softcapped(self, *args, **kwargs):  # a model that post-processes its logits
        out = hf_forward(self, *args, **kwargs)
        out["logits"] = torch.tanh(out["logits"][..., None]).squeeze(-1)[:, :1]
        return out

    monkeypatch.setattr(type(actor.model), "forward", softcapped)
    seq, attention, action = batch()
    with pytest.raises(RuntimeError, match="does not return its LM head's output.*--logprobs.full"):
        lp.chunked_forward(actor, seq, action, attention_mask=attention)


# ----------------------------------------------------------------------------- flags and seam
def _args(**values):
    from types import SimpleNamespace

    flat = {"logprobs.mode": None, "logprobs.chunk_mib": 256, "actor.entropy_coef": 0.0, **values}
    return SimpleNamespace(**flat)


def test_rpg_runs_default_to_chunked_and_stock_runs_to_full() -> None:
    assert lp.resolve(_args(), rpg_run=True)[0] == "chunked"
    assert lp.resolve(_args(), rpg_run=False)[0] == "full"
    assert lp.resolve(_args(**{"logprobs.mode": "chunked"}), rpg_run=False)[0] == "chunked"
    assert lp.resolve(_args(**{"logprobs.mode": "full"}), rpg_run=True)[0] == "full"
    with pytest.raises(ValueError, match="--logprobs.chunk_mib must be >= 1"):
        lp.resolve(_args(**{"logprobs.chunk_mib": 0}), rpg_run=True)


@pytest.mark.parametrize(
    "setting, flag",
    [
        ({"ds.ring_attn_size": 2}, "--ds.ring_attn_size"),
        ({"ds.tensor_parallel_size": 2}, "--ds.tensor_parallel_size"),
        ({"actor.entropy_coef": 0.01}, "--actor.entropy_coef"),
    ],
)
def test_unsupported_settings(setting, flag) -> None:
    args = _args(**setting)
    mode, note = lp.resolve(args, rpg_run=True)
    assert mode == "full" and flag in note and getattr(args, "logprobs.mode") == "full"
    assert not lp.enable(args)
    with pytest.raises(ValueError, match=f"--logprobs.chunked: .*{flag}.*use --logprobs.full"):
        lp.resolve(_args(**{**setting, "logprobs.mode": "chunked"}), rpg_run=True)


def test_stages_swap_the_actor_classes_and_forward(actor_mod, monkeypatch) -> None:
    import openrlhf.trainer.ray.launcher as launcher
    import openrlhf.trainer.ray.ppo_actor as ppo_actor

    from rpg_openrlhf.common import seam
    from rpg_openrlhf.common.patches import PATCHES

    monkeypatch.setattr(ppo_actor, "PolicyModelActor", ppo_actor.PolicyModelActor)
    monkeypatch.setattr(launcher, "ReferenceModelActor", launcher.ReferenceModelActor)
    monkeypatch.setattr(actor_mod.Actor, "forward", actor_mod.Actor.forward)
    monkeypatch.setitem(lp._STATE, "original", None)
    before = ppo_actor.PolicyModelActor.__ray_actor_class__
    assert seam.apply(PATCHES, "logprobs") == ["chunked_logprobs_policy", "chunked_logprobs_reference"]
    for cls in (ppo_actor.PolicyModelActor, launcher.ReferenceModelActor):
        assert issubclass(cls.__ray_actor_class__, lp.ChunkedLogprobsMixin)
    assert ppo_actor.PolicyModelActor.__ray_actor_class__.__mro__[1:3] == (lp.ChunkedLogprobsMixin, before)
    seam.apply(PATCHES, "logprobs")  # twice: wrapped once
    assert ppo_actor.PolicyModelActor.__ray_actor_class__.__mro__[1:3] == (lp.ChunkedLogprobsMixin, before)
    stock = actor_mod.Actor.forward
    assert seam.apply(PATCHES, "logprobs-worker") == ["chunked_logprobs_forward"]
    assert actor_mod.Actor.forward is lp.chunked_forward and lp._STATE["original"] is stock
