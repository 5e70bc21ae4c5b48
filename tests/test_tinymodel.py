"""The tiny models every other test builds on: deterministic, loadable, round-tripping text."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rpg_openrlhf.tinymodel import ARITHMETIC_ALPHABET, build_tiny_model


def test_same_seed_same_weights_other_seed_differs(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=3))
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=3))
    c = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "c", seed=4))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_tokenizer_round_trips_any_text_through_autotokenizer(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "Find $\\frac{1}{2}$ of 336^\\circ.\n\tAnswer: 168 é ∑"
    assert tok.decode(tok(text).input_ids) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "2+3"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "user: 2+3\nassistant: "
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)


def test_restricted_alphabet_keeps_a_small_vocabulary(tmp_path):
    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m", alphabet=ARITHMETIC_ALPHABET))
    assert len(tok) == 3 + len(set(ARITHMETIC_ALPHABET))
    assert tok.decode(tok("12+7=19").input_ids) == "12+7=19"
