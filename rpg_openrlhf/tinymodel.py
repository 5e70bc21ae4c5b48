"""Tiny Hugging Face models built offline, for tests, the demo and benchmarks.

No weights or tokenizers can be downloaded here, so the project builds its own: a random-init
``Qwen2ForCausalLM`` (the architecture family of the paper's models) with a character-level
(byte-level, no merges) tokenizer whose vocabulary is fixed by an alphabet. Both are saved with ``save_pretrained`` and
load with ``AutoModelForCausalLM`` / ``AutoTokenizer`` like any hub checkpoint, so every code path
(OpenRLHF, lm-eval, the eval harness) runs unchanged on them.
"""

from __future__ import annotations

from pathlib import Path

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
#: Digits and the arithmetic symbols of the demo task ("12+7=19"), plus a space.
ARITHMETIC_ALPHABET = "0123456789+=: "

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer(alphabet: str | None = None, chat_template: bool = True):
    """A character-level byte-level BPE tokenizer (no merges), in the format of Qwen2's tokenizer.

    Transformers maps a ``qwen2`` checkpoint to ``Qwen2Tokenizer`` whatever the tokenizer files say,
    and that class re-applies Qwen's byte-level pre-tokenizer; a byte-level vocabulary therefore
    round-trips exactly through ``AutoTokenizer``. Ids 0, 1, 2 are ``<pad>``, ``<eos>``, ``<unk>``.
    ``alphabet=None`` keeps all 256 byte symbols (any text encodes); a given alphabet keeps only its
    characters' bytes (a smaller output space for the demo; other characters are dropped).
    """
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    byte_symbols = sorted(ByteLevel.alphabet())
    if alphabet is not None:
        if not alphabet:
            raise ValueError("alphabet: must contain at least one character (or be None for all bytes)")
        wanted = set(alphabet.encode("utf-8"))
        # ByteLevel maps byte b to a printable symbol; recover the map by pre-tokenizing each byte.
        symbol = {
            b: ByteLevel(add_prefix_space=False).pre_tokenize_str(bytes([b]).decode("latin-1"))[0][0]
            for b in wanted
            if b < 128
        }
        byte_symbols = sorted(set(symbol.values()))
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *byte_symbols])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                  padding_side="left", model_max_length=4096)  # fmt: skip
    if chat_template:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_model(
    out_dir: str | Path,
    alphabet: str | None = None,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
    chat_template: bool = True,
    max_positions: int = 4096,
) -> Path:
    """Build and save a random-init Qwen2 causal LM and its char tokenizer; deterministic for a seed.

    Returns ``out_dir``. The same arguments always give bit-identical weights.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden % heads or heads % kv_heads:
        raise ValueError(
            f"heads={heads}, kv_heads={kv_heads}: hidden must divide by heads, heads by kv_heads"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(alphabet, chat_template=chat_template)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=intermediate, max_position_embeddings=max_positions,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id, torch_dtype="float32",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):  # the caller's random stream stays undisturbed
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=True
    )
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
