"""``response_tokens`` is the number of token ids the model generated (issue 50 item 3), not the
length of the decoded text encoded again: with --max-tokens 4 that said 5-10 tokens for 29 of 32
records, so the report's "truncated" filter marked responses that had ended early. (A real
--max-tokens 4 run's records: tests/test_eval_hostile_input.py's shared run.)"""

from __future__ import annotations

from rpg_eval.run.lm_models import generated_count


def test_generated_count_cuts_at_the_end_and_at_a_stop_string() -> None:
    decode = "".join  # one character per token id
    assert generated_count(list("abcd"), {"\x00"}, decode, []) == 4  # ran to the limit
    assert generated_count(list("ab\x00\x00"), {"\x00"}, decode, []) == 3  # EOS counted, padding not
    assert generated_count(list("a\n\nbcd"), set(), decode, ["\n\n"]) == 3  # the batch went on after the stop
    assert generated_count(list("abcd"), set(), decode, ["zz", ""]) == 4
