"""``response_tokens`` is the number of token ids the model generated (issue 50 item 3), not the
length of the decoded text encoded again: with --max-tokens 4 that said 5-10 tokens for 29 of 32
records, so the report's "truncated" filter marked responses that had ended early.

Generates with the session's tiny checkpoint (tests/conftest.py) on the hf backend, 2 problems x
4 samples of at most 4 tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main
from rpg_eval.run.lm_models import generated_count


def test_generated_count_cuts_at_the_end_and_at_a_stop_string() -> None:
    decode = "".join  # one character per token id
    assert generated_count(list("abcd"), {"\x00"}, decode, []) == 4  # ran to the limit
    assert generated_count(list("ab\x00\x00"), {"\x00"}, decode, []) == 3  # EOS counted, padding not
    assert generated_count(list("a\n\nbcd"), set(), decode, ["\n\n"]) == 3  # the batch went on after the stop
    assert generated_count(list("abcd"), set(), decode, ["zz", ""]) == 4


@pytest.mark.slow
def test_a_max_tokens_4_run_records_at_most_4_tokens(tiny_model_dir: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpts" / "global_step5_hf"
    shutil.copytree(tiny_model_dir, ckpt)
    data = tmp_path / "demo.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                            for i in range(2)))  # fmt: skip
    out = tmp_path / "eval"
    rc = cli_main(["run", "--checkpoints", str(tmp_path / "ckpts"), "--out", str(out), "--benchmarks", "demo",
                   "--data", f"demo={data}", "--prompt-style", "plain", "--backend", "hf", "--device", "cpu",
                   "--n", "4", "--max-tokens", "4", "--temperature", "1.0", "--no-summary"])  # fmt: skip
    assert rc == 0
    records = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    tokens = [r["response_tokens"] for r in records]
    assert len(records) == 8 and all(1 <= t <= 4 for t in tokens), tokens
    assert 4 in tokens  # a random model mostly runs to the limit
