"""rpg-train on meaningless or hostile input (issue 31, items 8 and the one-line errors): each is refused
before Ray with one line ``rpg-train: error: ...`` naming the flag, file or path (the real parser,
in-process, ``ray.init`` booby-trapped: test_launch_rejects_before_ray's fixture)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_launch_rejects_before_ray import no_ray  # noqa: F401 - the fixture
from test_rpg_flags import BASE

MODEL = Path(__file__).parent / "data" / "dry_run_model"
RPG = ["--rpg.loss", "urkl", "--rpg.style", "reinforce_clip"]
TOKEN = ["--algo.advantage.is_correction_level", "token"]
THRESHOLD = "--algo.advantage.is_correction_threshold"


def error_line(argv: list[str], capsys, dry_run: bool = True) -> str:
    from rpg_openrlhf.launch.cli import main

    with pytest.raises(SystemExit) as info:
        main([*argv, *(["--dry-run"] if dry_run else [])])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("rpg-train: error: ") and "Traceback" not in err[0], err
    return err[0]


MEANINGLESS = [
    ([*BASE, *RPG, *TOKEN, "--rpg.weight_level", "token", THRESHOLD, "0", "0"], "keeps no unit"),
    ([*BASE, *TOKEN, THRESHOLD, "3", "1"], "0 <= LOW <= HIGH"),  # stock, low > high
    ([*BASE, *TOKEN, THRESHOLD, "2", "2"], "width 0"),
    ([*BASE, "--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_mode", "clip"],
     "needs --algo.advantage.is_correction_level token"),  # stock, clip with seq
    ([*BASE, THRESHOLD, "1", "2", "3"], "takes HIGH or LOW HIGH"),
    ([*BASE, "--train.async_queue_size", "0"], "--train.async_queue_size must be >= 1"),
    ([a for a in BASE if a != BASE[BASE.index("--reward.remote_url") + 1] and a != "--reward.remote_url"],
     "no reward source"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "message"), MEANINGLESS, ids=[m for _, m in MEANINGLESS])
def test_meaningless_settings_refused_at_dry_run(argv, message, capsys) -> None:
    assert message in error_line(argv, capsys)


def _model(tmp_path: Path, **config: object) -> Path:
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    body = json.loads((model / "config.json").read_text())
    body.update(config)
    (model / "config.json").write_text(json.dumps(body))
    return model


def _with_model(model: Path) -> list[str]:
    argv = list(BASE)
    argv[argv.index("--actor.model_name_or_path") + 1] = str(model)
    return argv


@pytest.mark.parametrize(
    ("config", "key"),
    [({"num_attention_heads": 0}, "num_attention_heads"), ({"hidden_size": -64}, "hidden_size"),
     ({"vocab_size": float("inf")}, "vocab_size"),
     ({"vocab_size": int("9" * 400)}, "vocab_size")],
)  # fmt: skip
def test_absurd_model_config_is_named(tmp_path: Path, config: dict, key: str, capsys) -> None:
    model = _model(tmp_path, **config)
    line = error_line(_with_model(model), capsys)
    assert str(model / "config.json") in line and key in line, line


def test_model_config_that_is_a_list(tmp_path: Path, capsys) -> None:
    model = _model(tmp_path)
    (model / "config.json").write_text("[1, 2]")
    line = error_line(_with_model(model), capsys)
    assert str(model / "config.json") in line and "JSON object" in line, line


@pytest.mark.parametrize("where", ["under_a_file", "proc"])
def test_unwritable_ckpt_path_is_one_line_before_ray(tmp_path: Path, where: str, no_ray, capsys) -> None:  # noqa: F811
    if where == "under_a_file":
        (tmp_path / "file").write_text("x")
        path = tmp_path / "file" / "ckpt"
    else:
        path = Path("/proc/self/rpg-ckpt")  # a read-only filesystem (root can write anywhere else)
    line = error_line(
        [*BASE, *RPG, "--ckpt.path", str(path), "--ckpt.save_steps", "1"], capsys, dry_run=False
    )
    assert f"--ckpt.path {path}" in line, line


# ----------------------------------------------------------------------------- issue 38, items 9, 10
@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--actor.entropy_coef", "nan"], "--actor.entropy_coef nan: not a number"),
     (["--actor.entropy_coef", "inf"], "--actor.entropy_coef inf: must be finite"),
     (["--logprobs.chunk_mib", str(10**30)], "--logprobs.chunk_mib 1000000000000000000000000000000: at most"),
     (["--rpg.resume_changes", "rpg.los"], "'rpg.los' is not a setting of rpg-train (closest: --rpg.loss"),
     (["--rpg.resume_changes", "rpg.loss,--made.up"], "'--made.up' is not a setting of rpg-train")],
)  # fmt: skip
def test_meaningless_numbers_and_names_are_one_line(argv: list[str], message: str, capsys) -> None:
    assert message in error_line([*BASE, *RPG, *argv], capsys)


def test_the_plan_charges_what_a_chunk_takes_not_the_whole_budget() -> None:
    """A chunk holds chunk_tokens_for(V, bf16, budget) rows (the runtime's rule), never more rows than the
    micro-batch has: a budget above 8 N V costs 8 N V."""
    import torch

    from rpg_openrlhf.core.logprobs import chunk_tokens_for
    from rpg_openrlhf.launch import memory_terms
    from rpg_openrlhf.launch.model_shape import PAPER_MODELS

    shape = PAPER_MODELS["Qwen/Qwen3-4B"]
    for tokens, budget in ((100, 2**100), (9216, 256 * 2**20), (3, 2**20), (50_000, 2**40)):
        rows = min(tokens, chunk_tokens_for(shape.vocab, torch.bfloat16, budget))
        assert memory_terms.chunk_bytes(shape, tokens, budget) == rows * shape.vocab * (4 + 2 * 2)
        assert memory_terms.chunked_forward_bytes(shape, tokens, budget) < 2**40
