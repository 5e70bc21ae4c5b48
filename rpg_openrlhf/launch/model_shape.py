"""The architecture numbers of a decoder-only model, for the memory plan (no weights are read).

:func:`load_shape` reads ``config.json`` from a local model directory or, for a hub id, from the
local Hugging Face cache (never downloading: a dry-run is a plan and works offline). When neither
has it, the paper's two models come from :data:`PAPER_MODELS`, numbers copied from their
``config.json`` on the hub, used only then and labelled as such in the plan.

Parameter count of a Qwen2/Qwen3/Llama-style decoder (q_dim = heads x head_dim,
kv_dim = kv_heads x head_dim):

    per layer  P_l = H q_dim + 2 H kv_dim + q_dim H      (q, k, v, o projections)
                     + [q_dim + 2 kv_dim]                (q/k/v biases, Qwen2)
                     + [2 head_dim]                      (q_norm, k_norm, Qwen3)
                     + 3 H I + 2 H                       (gate, up, down; two RMSNorms)
    model      P   = L P_l + V H (embedding) + H (final norm) + [V H] (lm_head, unless tied)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers of a decoder-only transformer."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_word_embeddings: bool
    qkv_bias: bool = False  # Qwen2: biases on the q, k, v projections
    qk_norm: bool = False  # Qwen3: an RMSNorm on each head's q and k
    source: str = ""  # where the numbers came from

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """P_l of the module docstring."""
        attention = 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim
        attention += (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        attention += 2 * self.head_dim if self.qk_norm else 0
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        """V H: the embedding (and, untied, the lm_head has as many)."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """P of the module docstring."""
        heads = 1 if self.tie_word_embeddings else 2
        return self.layers * self.layer_params + heads * self.embedding_params + self.hidden


#: The paper's models (their hub config.json), used only when the config is not available locally.
PAPER_MODELS: dict[str, ModelShape] = {
    "Qwen/Qwen3-4B": ModelShape(
        layers=36, hidden=2560, intermediate=9728, heads=32, kv_heads=8, head_dim=128, vocab=151936,
        tie_word_embeddings=True, qk_norm=True,
    ),
    "Qwen/Qwen2.5-7B-Instruct": ModelShape(
        layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128, vocab=152064,
        tie_word_embeddings=False, qkv_bias=True,
    ),
}  # fmt: skip


#: The largest count the plan takes (a vocabulary of 2^31 tokens is already absurd): beyond it, or
#: below 1, a config.json number is refused naming the file, not turned into a plan of "-0.00e9
#: parameters" that fits, a ZeroDivisionError (0 heads) or an OverflowError (Infinity, 400 digits).
MAX_COUNT = 2**31


def _count(config: dict[str, Any], key: str, source: str, default: Any = None) -> int:
    """``config[key]`` as a count in [1, MAX_COUNT] (ValueError naming the file and key); KeyError
    when it is absent without a default."""
    value = config.get(key) if default is not None else config[key]
    value = default if value is None else value
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok or (isinstance(value, float) and value.is_integer())  # 4096.0 written by some tools
    if not ok or not 1 <= value <= MAX_COUNT:
        shown = value if len(repr(value)) < 40 else f"{repr(value)[:20]}... ({len(repr(value))} characters)"
        raise ValueError(f"{source}: {key} must be a whole number in [1, 2^31], got {shown!r}")
    return int(value)


def shape_from_config(config: dict[str, Any], source: str) -> ModelShape:
    """A :class:`ModelShape` from a transformers ``config.json`` (a VLM's ``text_config`` if it has one).
    LookupError when a number the plan needs is missing; ValueError when one is not a count."""
    if not isinstance(config, dict):
        raise ValueError(
            f"{source}: expected a JSON object (a model config), got a JSON {type(config).__name__}"
        )
    text = config.get("text_config")
    config = text if isinstance(text, dict) and text else config
    try:
        heads = _count(config, "num_attention_heads", source)
        hidden = _count(config, "hidden_size", source)
        model_type = str(config.get("model_type", ""))
        return ModelShape(
            layers=_count(config, "num_hidden_layers", source),
            hidden=hidden,
            intermediate=_count(config, "intermediate_size", source),
            heads=heads,
            kv_heads=_count(config, "num_key_value_heads", source, heads),
            head_dim=_count(config, "head_dim", source, max(hidden // heads, 1)),
            vocab=_count(config, "vocab_size", source),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("attention_bias", model_type.startswith("qwen2"))),
            qk_norm=model_type.startswith("qwen3"),
            source=source,
        )
    except KeyError as exc:
        raise LookupError(f"{source}: not a decoder config the memory plan knows ({exc!r} missing)") from exc


def _local_config_path(name: str) -> str | None:
    """config.json of a local model directory, or of a hub id in the local cache (no download)."""
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        candidate = os.path.join(path, "config.json")
        return candidate if os.path.isfile(candidate) else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
    except Exception:  # not a valid repo id: nothing cached under it
        return None
    return cached if isinstance(cached, str) else None


def load_shape(name: str) -> ModelShape:
    """The shape of ``--actor.model_name_or_path`` (LookupError when it cannot be known offline)."""
    path = _local_config_path(name)
    if path is not None:
        from rpg_openrlhf.common.cliutil import load_json

        with open(path, "rb") as f:
            return shape_from_config(load_json(f.read(), path), source=path)
    if name in PAPER_MODELS:
        return replace(
            PAPER_MODELS[name], source=f"{name}: built-in table (config.json not available locally)"
        )
    raise LookupError(
        f"{name}: no config.json locally (directory or Hugging Face cache) and not a paper model"
    )
