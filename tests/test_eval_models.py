"""Loading a checkpoint for ``rpg-eval run`` (rpg_eval.run.runner, rpg_eval.run.lm_models): a model that
cannot be evaluated is one line naming the checkpoint and what to change (issue #19 item 8), never
a library error without the checkpoint (SafetensorError, "unrecognized model_type", TypeError:
multiple values for keyword argument, an AssertionError on too many tokens).

Uses the session's tiny checkpoint (tests/conftest.py); every case stops before generating."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RUN = ["--benchmarks", "aime24", "--backend", "hf", "--device", "cpu", "--limit", "1", "--n", "1",
       "--max-tokens", "4", "--no-summary", "--data-dir", str(DATA)]  # fmt: skip


def _copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpts" / "global_step5_hf"
    shutil.copytree(tiny_model_dir, ckpt)
    return ckpt


def _line(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip() and not x.startswith("[rpg-eval]")]
    assert len(lines) == 1 and lines[0].startswith("rpg-eval: error:"), lines
    return lines[0]


def _truncate_weights(ckpt: Path) -> None:
    (w,) = ckpt.glob("*.safetensors")
    w.write_bytes(w.read_bytes()[:100])


def _unknown_type(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "model_type": "no_such_model"}))


@pytest.mark.parametrize(
    ("damage", "says"),
    [(_truncate_weights, "does not load"), (_unknown_type, "does not load")],
    ids=["truncated safetensors", "unknown model_type"],
)
def test_a_model_that_does_not_load_names_the_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, capsys, damage, says: str
) -> None:
    ckpt = _copy(tiny_model_dir, tmp_path)
    damage(ckpt)
    out = tmp_path / "o"
    assert cli_main(["run", "--checkpoints", str(ckpt.parent), "--out", str(out), *RUN]) == 2
    line = _line(capsys)
    assert "global_step5_hf" in line and says in line, line
    assert not (out / "samples.jsonl").exists()


def test_more_tokens_than_positions_names_the_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    """`--max-tokens 5000` on a 4,096-position model was an AssertionError inside lm-eval."""
    ckpt = _copy(tiny_model_dir, tmp_path)
    positions = json.loads((ckpt / "config.json").read_text())["max_position_embeddings"]
    out = tmp_path / "o"
    argv = [
        "run",
        "--checkpoints",
        str(ckpt.parent),
        "--out",
        str(out),
        *RUN,
        "--max-tokens",
        str(positions + 904),
    ]
    assert cli_main(argv) == 2
    line = _line(capsys)
    assert "global_step5_hf" in line and "--max-tokens" in line and str(positions) in line, line
    assert not out.exists()  # checked before the output directory is touched
