"""TRL's GRPO loss as its trainer computes it: the real GRPOTrainer, built by its own constructor, and its
compute_loss method, on a tiny model whose logits are the enumerable policy's.

TRL takes its KL inside GRPOTrainer._compute_loss (per_token_kl, use_bias_correction_kl), after the
model's forward through TRL's fused LM head (trl.trainer.utils.add_fused_lm_head), so the smallest real
unit is the trainer's loss method with a model. The model here (EnumerablePolicy) reads a batch of
enumerated sequences and returns, at the position that predicts a sequence's t-th completion token, the
logits of that entry: hidden state = one-hot of the entry (sequence i, position t), LM head weight
column (i, t) = the policy's logits there. Every entry has its own column, so one backward gives each
entry's own gradient (the columns of W.grad), which the caller weights by pi_old exactly.

Token level: completions are the L tokens of a sequence (vocabulary V), column (i, t) = theta[prefix].
Sequence level: a completion is one token, the sequence itself (vocabulary N = V^L), every column =
log pi_theta of all N sequences: the same formulas on sequence log-probs, as the core's weight_level
"sequence". TRL's fused head computes log-probs in float32 (trl/kernels/chunked_logprob.py).
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator
from types import SimpleNamespace

import torch
from torch import Tensor, nn

MODEL_TYPE = "rpg_enumerable_policy"


def _classes() -> SimpleNamespace:
    """The config and model classes, registered with transformers' Auto classes once (TRL builds the
    reference model from the policy's saved directory through AutoModelForCausalLM)."""
    import transformers as tf
    from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

    class EnumerableConfig(tf.PretrainedConfig):
        model_type = MODEL_TYPE

        def __init__(self, vocab_size: int = 4, length: int = 4, entries: int = 1, **kwargs) -> None:
            self.vocab_size, self.length, self.entries = vocab_size, length, entries
            self.auto_map = {}  # TRL's create_model_from_path reads it
            super().__init__(**kwargs)

    class Backbone(nn.Module):
        """input_ids [B, 1 + length] (a prompt token, then the completion) -> one-hot of the entry
        (sequence index * length + t) at the position predicting completion token t."""

        def __init__(self, config: EnumerableConfig) -> None:
            super().__init__()
            self.config = config

        def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, **_) -> BaseModelOutput:
            c = self.config
            powers = c.vocab_size ** torch.arange(c.length - 1, -1, -1)
            seq = (input_ids[:, 1 : 1 + c.length] * powers).sum(-1)  # lexicographic sequence index
            hidden = torch.zeros(*input_ids.shape, c.entries, dtype=torch.float64)
            rows = torch.arange(input_ids.shape[0])
            for t in range(c.length):
                hidden[rows, t, seq * c.length + t] = 1.0
            return BaseModelOutput(last_hidden_state=hidden)

    class EnumerablePolicy(tf.PreTrainedModel, tf.GenerationMixin):
        config_class = EnumerableConfig
        base_model_prefix = "backbone"

        def __init__(self, config: EnumerableConfig) -> None:
            super().__init__(config)
            self.backbone = Backbone(config)
            self.lm_head = nn.Linear(config.entries, config.vocab_size, bias=False, dtype=torch.float64)
            self.post_init()

        def get_output_embeddings(self) -> nn.Linear:
            return self.lm_head

        def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, **_) -> CausalLMOutput:
            return CausalLMOutput(logits=self.lm_head(self.backbone(input_ids).last_hidden_state))

    tf.AutoConfig.register(MODEL_TYPE, EnumerableConfig, exist_ok=True)
    tf.AutoModelForCausalLM.register(EnumerableConfig, EnumerablePolicy, exist_ok=True)
    return SimpleNamespace(config=EnumerableConfig, model=EnumerablePolicy)


def _tokenizer(vocab: int):
    """A word-level tokenizer over the ids 0..vocab-1 and a pad token (the trainer needs one)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {str(i): i for i in range(vocab)} | {"<pad>": vocab}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="<pad>")),
                                   pad_token="<pad>", eos_token="<pad>")  # fmt: skip


@contextlib.contextmanager
def grpo_trainer(trl: SimpleNamespace, vocab: int, length: int, num_seqs: int, **config: object) -> Iterator:
    """A GRPOTrainer of TRL's own constructor over an EnumerablePolicy (vocab, length, num_seqs
    sequences), GRPOConfig(**config) (beta, use_bias_correction_kl, epsilon, ...), on the CPU in
    float64; the reference model TRL builds is never used (the reference log-probs are inputs)."""
    import datasets
    import transformers

    classes = _classes()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="rpg-conformance-trl-") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        classes.model(classes.config(vocab, length, num_seqs * length)).save_pretrained(tmp)
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float64)
        args = trl.GRPOConfig(output_dir=tmp, report_to=[], use_cpu=True, bf16=False, num_generations=2,
                              per_device_train_batch_size=2, save_strategy="no", **config)  # fmt: skip
        trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                  args=args, processing_class=_tokenizer(vocab),
                                  train_dataset=datasets.Dataset.from_dict({"prompt": ["0", "1"]}))  # fmt: skip
        # the training loop sets this before it calls compute_loss (transformers' Trainer)
        trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        trainer.model.train()
        yield trainer


def entry_gradients(trainer, logits: Tensor, seqs: Tensor, old: Tensor, ref: Tensor, adv: Tensor) -> Tensor:
    """Each entry's gradient of the trainer's loss w.r.t. its own logits, [N, length, vocab]: the LM
    head's columns set to ``logits`` [N, length, vocab] (no gradient), compute_loss on the N sequences
    ``seqs`` [N, length] with old and reference log-probs [N, length] and advantages [N], backward."""
    n, length, vocab = logits.shape
    head = trainer.model.lm_head
    with torch.no_grad():
        head.weight.copy_(logits.reshape(n * length, vocab).T)
    head.weight.grad = None
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": seqs,
        "completion_mask": torch.ones(n, length, dtype=torch.long),
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": torch.tensor(float(n * length)),
    }
    trainer.compute_loss(trainer.model, inputs).backward()
    return head.weight.grad.T.reshape(n, length, vocab)
