"""``rpg-train`` checks before Ray starts (issue #11 item 10, #14 item 6, #11 items 1-3, 5).

Every case runs the real entry point in-process (OpenRLHF's parser and argument processing) with
``ray.init`` booby-trapped: a bad input must end in one ``rpg-train: error: ...`` line naming the
flag (exit status 2), in ``--dry-run`` and without it, before any Ray start. ``--dry-run`` prints
the arguments that will actually run (after RPG's own changes).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from test_eval_cli import _lines, _run
from test_launch_rejects_before_ray import no_ray  # noqa: F401 - the fixture

from rpg_openrlhf.common.cliutil import BNB_CPU_LOGGER

pytestmark = pytest.mark.usefixtures("no_ray")  # every case must stop before Ray

TESTS = Path(__file__).resolve().parent
MODEL = str(TESTS / "data" / "dry_run_model")  # config.json only: dry runs never load a model
REWARD = str(TESTS / "helpers" / "reward_has_digit.py")
BASE = [
    "--actor.model_name_or_path",
    MODEL,
    "--reward.remote_url",
    REWARD,
    "--rollout.n_samples_per_prompt",
    "4",
]


def run(argv: list[str]) -> None:
    from rpg_openrlhf.launch.cli import main

    main(["--rpg.backend", "cpu", *argv])


def error_of(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """The one-line error of a run that must stop before Ray (exit status 2)."""
    with pytest.raises(SystemExit) as info:
        run(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rpg-train: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def dry_run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[dict, str]:
    run([*argv, "--dry-run"])
    out = capsys.readouterr().out
    return json.loads(out[out.index("\n{\n") + 1 :]), out


# ----------------------------------------------------------------------------- model
def test_missing_model_is_a_usage_error(capsys) -> None:
    assert "--actor.model_name_or_path is required" in error_of(["--reward.remote_url", REWARD], capsys)


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("/nonexistent/model", "no such directory"),
        (str(TESTS / "data"), "no config.json"),
        (REWARD, "is a file"),
        ("not a valid id!", "valid hub id"),
    ],
)
def test_model_that_cannot_load_is_refused(model: str, says: str, capsys) -> None:
    err = error_of(["--actor.model_name_or_path", model, "--reward.remote_url", REWARD, "--dry-run"], capsys)
    assert "--actor.model_name_or_path" in err and says in err, err


def test_hub_id_offline_needs_the_cache(capsys, monkeypatch, tmp_path) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["--actor.model_name_or_path", "someorg/some-model", "--reward.remote_url", REWARD, "--dry-run"]
    err = error_of(argv, capsys)
    assert "someorg/some-model" in err and "cache" in err and "HF_HUB_OFFLINE" in err
    # The same id in the local cache (huggingface_hub's layout, written here by hand) is fine offline.
    repo = tmp_path / "hub" / "models--someorg--some-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text((Path(MODEL) / "config.json").read_text())
    _, out = dry_run(argv[:-1], capsys)
    assert "hub id, in the local cache" in out
    # Online, an id not in the cache is accepted (it will be downloaded); nothing is fetched now.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    _, out = dry_run(["--actor.model_name_or_path", "otherorg/other", "--reward.remote_url", REWARD], capsys)
    assert "will be downloaded" in out


def test_a_truncated_weight_file_is_refused_before_ray(capsys, tmp_path) -> None:
    """A half-copied checkpoint would fail inside the policy workers after Ray started (issue #21)."""
    from rpg_openrlhf.tinymodel import build_tiny_model

    model = build_tiny_model(tmp_path / "m", hidden=32, layers=1, heads=1, kv_heads=1, intermediate=32)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    err = error_of(
        ["--actor.model_name_or_path", str(model), "--reward.remote_url", REWARD, "--dry-run"], capsys
    )
    assert (
        f"--actor.model_name_or_path {model}: model.safetensors cannot be read" in err and "truncated" in err
    )


# ----------------------------------------------------------------------------- reward
def test_missing_reward_file_is_refused(capsys) -> None:
    err = error_of(["--actor.model_name_or_path", MODEL, "--reward.remote_url", "/nope/reward.py"], capsys)
    assert "--reward.remote_url /nope/reward.py" in err and "no such file" in err
    err = error_of([*BASE, "--train.agent_func_path", "/nope/agent.py", "--dry-run"], capsys)
    assert "--train.agent_func_path" in err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("def reward_func(queries, prompts, labels:\n    return {}\n", "reward.py:1: syntax error"),
        (
            "def other(queries, prompts, labels):\n    return {}\n",
            "defines no top-level function reward_func",
        ),
    ],
    ids=["syntax-error", "no-reward-func"],
)
def test_a_reward_file_that_cannot_load_is_refused(capsys, tmp_path, content, expected) -> None:
    """issue #19 item 11: --dry-run used to accept these and report success (OpenRLHF would fail
    later, inside the rollout actors, and swallow the error)."""
    path = tmp_path / "reward.py"
    path.write_text(content)
    err = error_of(
        ["--actor.model_name_or_path", MODEL, "--reward.remote_url", str(path), "--dry-run"], capsys
    )
    assert f"--reward.remote_url {path}" in err and expected in err, err
    assert not any((tmp_path / "reward.py").glob("__pycache__")) and not (tmp_path / "__pycache__").exists()


def test_a_mistyped_flag_is_one_line_not_a_prefix_of_another(capsys) -> None:
    """issue #19: no prefix matching (--rpg.los is not --rpg.loss) and no 170-line usage block."""
    for argv, expected in (
        (["--rpg.los", "urkl"], "rpg-train: error: unrecognized arguments: --rpg.los urkl"),
        (["--rpg.loss", "nope"], "rpg-train: error: argument --rpg.loss: 'nope' is not registered"),
    ):
        with pytest.raises(SystemExit) as info:
            run([*BASE, *argv, "--dry-run"])
        err = capsys.readouterr().err
        assert info.value.code == 2 and "usage:" not in err and "train_ppo_ray.py" not in err, err[-2000:]
        assert [line for line in err.splitlines() if "error" in line][0].startswith(expected), err[-2000:]


def test_http_reward_endpoint_is_not_checked(capsys) -> None:
    cfg, _ = dry_run(
        ["--actor.model_name_or_path", MODEL, "--reward.remote_url", "http://rm:5000/get_reward"], capsys
    )
    assert cfg["openrlhf"]["reward"]["remote_url"] == ["http://rm:5000/get_reward"]


def test_unknown_reward_grader_is_refused_and_a_known_one_reaches_workers(capsys, monkeypatch) -> None:
    monkeypatch.setenv("RPG_REWARD_GRADER", "bogus")
    err = error_of([*BASE, "--dry-run"], capsys)
    assert "RPG_REWARD_GRADER='bogus'" in err and "paper" in err
    monkeypatch.setenv("RPG_REWARD_GRADER", "paper")
    cfg, _ = dry_run(BASE, capsys)
    assert cfg["worker_env"] == {"RPG_REWARD_GRADER": "paper"}


# ----------------------------------------------------------------------------- what will run
def test_typed_gae_conflicts_with_rpg_but_the_default_does_not(capsys) -> None:
    err = error_of([*BASE, "--rpg.loss", "urkl", "--algo.advantage.estimator", "gae", "--dry-run"], capsys)
    assert "--algo.advantage.estimator gae" in err and "'rpg'" in err
    cfg, _ = dry_run([*BASE, "--rpg.loss", "urkl"], capsys)
    assert cfg["openrlhf"]["algo"]["advantage"]["estimator"] == "rpg"
    # Stock runs keep OpenRLHF's default estimator (and its critic).
    cfg, _ = dry_run(BASE, capsys)
    assert cfg["openrlhf"]["algo"]["advantage"]["estimator"] == "gae"
    assert cfg["openrlhf"]["critic"]["model_name_or_path"] == MODEL


def test_openrlhf_own_argument_checks_are_usage_errors(capsys) -> None:
    err = error_of(
        [*BASE, "--algo.dynamic_filtering_enable", "--rollout.n_samples_per_prompt", "1", "--dry-run"], capsys
    )
    assert "n_samples_per_prompt" in err


# ----------------------------------------------------------------------------- run length, Schedule-Free
def test_max_steps_is_checked_and_shown(capsys) -> None:
    assert "--rpg.max_steps must be >= 1" in error_of([*BASE, "--rpg.max_steps", "0", "--dry-run"], capsys)
    cfg, _ = dry_run([*BASE, "--rpg.max_steps", "400"], capsys)  # a stock run may have a budget too
    assert cfg["openrlhf"]["rpg"]["max_steps"] == 400 and cfg["rpg"] == {"enabled": False}


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--ds.adam_offload"], "--ds.adam_offload"),
        (["--ds.enable_sleep", "--ds.zero_stage", "3"], "--ds.enable_sleep"),
    ],
)
def test_schedulefree_combinations_deepspeed_cannot_run(extra, flag, capsys) -> None:
    sf = ["--rpg.loss", "urkl", "--rpg.optimizer", "schedulefree", "--actor.lr_scheduler", "constant"]
    err = error_of([*BASE, *sf, *extra], capsys)  # not a dry run: it must still stop before Ray
    assert flag in err and "--rpg.optimizer schedulefree" in err
    cfg, _ = dry_run([*BASE, *sf, "--ds.zero_stage", "3"], capsys)
    assert cfg["rpg"]["optimizer"] == "schedulefree"


# ----------------------------------------------------------------------------- meaningless or hostile input
TOKEN = ["--algo.advantage.is_correction_level", "token"]
THRESHOLD = "--algo.advantage.is_correction_threshold"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*BASE, "--rpg.loss", "urkl", *TOKEN, "--rpg.weight_level", "token", THRESHOLD, "0", "0"], "keeps no unit"),
        ([*BASE, *TOKEN, THRESHOLD, "3", "1"], "0 <= LOW <= HIGH"),  # a stock run
        ([*BASE, "--train.async_queue_size", "0"], "--train.async_queue_size must be >= 1"),
        (["--actor.model_name_or_path", MODEL], "no reward source"),
        ([*BASE, "--actor.entropy_coef", "nan"], "--actor.entropy_coef nan: not a number"),
        ([*BASE, "--logprobs.chunk_mib", str(10**30)], "--logprobs.chunk_mib 1000000000000000000000000000000: at most"),
        ([*BASE, "--rpg.resume_changes", "rpg.los"], "'rpg.los' is not a setting of rpg-train (closest: --rpg.loss"),
    ],
    ids=["band", "low-high", "queue", "reward", "nan", "chunk", "resume-name"],
)  # fmt: skip
def test_meaningless_settings_are_one_line(argv: list[str], message: str, capsys) -> None:
    assert message in error_of([*argv, "--dry-run"], capsys)


@pytest.mark.parametrize(
    ("config", "key"), [('{"num_attention_heads": 0}', "num_attention_heads"), ("[1, 2]", "JSON object")]
)
def test_absurd_model_config_is_named(tmp_path: Path, config: str, key: str, capsys) -> None:
    """A downloaded checkpoint's config.json: a value no model has, or no JSON object at all."""
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    body = json.loads(config)
    if isinstance(body, dict):
        body = {**json.loads((model / "config.json").read_text()), **body}
    (model / "config.json").write_text(json.dumps(body))
    err = error_of(
        ["--actor.model_name_or_path", str(model), "--reward.remote_url", REWARD, "--dry-run"], capsys
    )
    assert str(model / "config.json") in err and key in err, err


def test_unwritable_ckpt_path_is_one_line_before_ray(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / "ckpt"
    err = error_of([*BASE, "--rpg.loss", "urkl", "--ckpt.path", str(path), "--ckpt.save_steps", "1"], capsys)
    assert f"--ckpt.path {path}" in err, err


# ----------------------------------------------------------------------------- no noise (issue 31)
def test_rpg_train_silences_the_bitsandbytes_cpu_kernel_warning(capsys) -> None:
    from rpg_openrlhf.launch.cli import main

    logger = logging.getLogger(BNB_CPU_LOGGER)
    logger.setLevel(logging.NOTSET)
    with pytest.raises(SystemExit):
        main(["--no-such-flag"])
    capsys.readouterr()
    assert not logger.isEnabledFor(logging.WARNING)  # what bitsandbytes logs it at
    assert logger.isEnabledFor(logging.ERROR)


def test_rpg_eval_refuses_an_empty_run_name(tmp_path: Path, capsys) -> None:
    from rpg_eval.cli import main

    assert main([*_run(tmp_path), "--run", "  "]) == 2
    (line,) = _lines(capsys.readouterr().err)
    assert "--run" in line and "non-empty" in line, line
    assert not (tmp_path / "o").exists()
