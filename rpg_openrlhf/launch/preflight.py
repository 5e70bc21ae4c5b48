"""Checks ``rpg-train`` makes on the parsed arguments right after argparse, before OpenRLHF's own
processing and before Ray (in ``--dry-run`` too): OpenRLHF would otherwise fail later, inside the
Ray actors, or swallow the error. Each raises ``ValueError`` naming the flag or variable; the entry
point prints it as one ``rpg-train: error: ...`` line and exits 2. Paths are checked on the driver's
filesystem (on a cluster they must exist at the same place on every node).
"""

from __future__ import annotations

import ast
import math
import os
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.args import get as _get

#: Values huggingface_hub reads as true in HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE.
_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """Whether huggingface_hub will refuse to download (its own rule, read now)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in _TRUE


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or "\\" in name


def check_model(args: Any) -> str:
    """``--actor.model_name_or_path`` can load: returns how (a line for the log)."""
    name = _get(args, "actor.model_name_or_path")
    if not name:
        raise ValueError("--actor.model_name_or_path is required (a Hugging Face model directory or hub id)")
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(
                f"--actor.model_name_or_path {name}: the directory has no config.json "
                "(not a Hugging Face model directory)"
            )
        _check_safetensors(name, path)
        return f"model {name}: local directory"
    if os.path.exists(path):
        raise ValueError(f"--actor.model_name_or_path {name}: is a file, not a model directory")
    if _looks_like_path(name):
        raise ValueError(f"--actor.model_name_or_path {name}: no such directory")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as e:
        raise ValueError(
            f"--actor.model_name_or_path {name}: neither an existing directory nor a valid hub id ({e})"
        ) from e
    if _get(args, "use_ms"):
        return f"model {name}: ModelScope id (--use_ms), not checked"
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return f"model {name}: hub id, in the local cache"
    if hub_offline():
        raise ValueError(
            f"--actor.model_name_or_path {name}: no such directory, and as a hub id it is not in the "
            "local Hugging Face cache while HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE forbid downloading it; "
            "download it first (huggingface-cli download) or pass a local directory"
        )
    return f"model {name}: hub id, not in the local cache (will be downloaded)"


def _check_python_file(flag: str, path: str, defines: str | None) -> None:
    """``path`` is a Python file that parses (read, never run) and, if ``defines``, defines it at top level."""
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a directory, not a Python file")
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except SyntaxError as e:
        raise ValueError(f"{flag} {path}:{e.lineno}: syntax error: {e.msg}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{flag} {path}: cannot be read ({e})") from e
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    if defines and defines not in names:
        raise ValueError(f"{flag} {path}: defines no top-level function {defines}(queries, prompts, labels)")


def _check_safetensors(name: str, path: str) -> None:
    """Every ``*.safetensors`` in the model directory has a whole header (truncated copies fail in
    the workers otherwise, after Ray has started). Reads the headers only."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(Path(path).glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                f.keys()
        except (SafetensorError, OSError) as e:
            raise ValueError(
                f"--actor.model_name_or_path {name}: {file.name} cannot be read ({e}); the copy is "
                "truncated or damaged: copy the checkpoint again"
            ) from e


def check_reward_files(args: Any) -> None:
    """Local reward-function and agent files exist, parse, and (reward) define ``reward_func``.

    OpenRLHF loads them inside the rollout actors and swallows the error; HTTP reward endpoints
    are not checked. A local directory given as a reward is refused too (it is no endpoint)."""
    urls = _get(args, "reward.remote_url")
    entries = urls if isinstance(urls, list | tuple) else ([] if urls is None else str(urls).split(","))
    for entry in entries:
        entry = entry.strip()
        if entry.endswith(".py") or os.path.isdir(entry):
            _check_python_file("--reward.remote_url", entry, "reward_func")
    agent = _get(args, "train.agent_func_path")
    if agent:
        _check_python_file("--train.agent_func_path", agent, None)


def check_reward_source(args: Any) -> None:
    """Some reward is given: a remote/function reward, a reward model, or an agent."""
    if not any(
        _get(args, k) for k in ("reward.remote_url", "reward.model_name_or_path", "train.agent_func_path")
    ):
        raise ValueError(
            "no reward source: give --reward.remote_url (a reward function file or an HTTP endpoint), "
            "--reward.model_name_or_path or --train.agent_func_path"
        )


def check_async_queue(args: Any) -> None:
    """``--train.async_queue_size``: the number of rollouts the async generator may run ahead."""
    size = _get(args, "train.async_queue_size")
    if size is not None and size < 1:
        raise ValueError(f"--train.async_queue_size must be >= 1 (rollouts queued ahead), got {size}")


_THRESHOLD = "--algo.advantage.is_correction_threshold"


def check_correction(args: Any) -> None:
    """OpenRLHF's rollout-correction flags, for stock and RPG runs (the RPG-only rules are in
    ``plugin.validation``)."""
    values = _get(args, "algo.advantage.is_correction_threshold")
    level, mode, gating = (
        _get(args, f"algo.advantage.is_correction_{k}") for k in ("level", "mode", "gating")
    )
    if values is None:
        return
    values = [float(v) for v in values]
    if len(values) not in (1, 2) or not all(math.isfinite(v) for v in values):
        raise ValueError(
            f"{_THRESHOLD} takes HIGH or LOW HIGH (finite numbers), got {' '.join(map(str, values))}"
        )
    if level in (None, "off"):
        return
    low, high = values if len(values) == 2 else (0.0, values[0])
    if not 0 <= low <= high:
        raise ValueError(f"{_THRESHOLD} LOW HIGH needs 0 <= LOW <= HIGH, got {low:g} {high:g}")
    if not high > 0:
        raise ValueError(
            f"{_THRESHOLD} HIGH must be > 0: a band [{low:g}, {high:g}] keeps no unit, nothing trains"
        )
    if mode in (None, "mask") and low == high:
        raise ValueError(
            f"{_THRESHOLD} {low:g} {high:g}: in mask mode a band of width 0 keeps only ratios exactly {high:g} "
            "(almost no unit trains); give LOW < HIGH"
        )
    clip = "--algo.advantage.is_correction_mode clip clamps a token's ratio: it needs"
    if mode == "clip" and level == "seq":
        raise ValueError(f"{clip} --algo.advantage.is_correction_level token (got seq: use mode mask)")
    if mode == "clip" and gating not in (None, "ratio"):
        raise ValueError(f"{clip} --algo.advantage.is_correction_gating ratio (got {gating})")


def check_reward_grader() -> str | None:
    """``RPG_REWARD_GRADER``, if set, names a grader; returns the grader the reward file will use."""
    from rpg_openrlhf.plugin.reward import GRADER_ENV, GRADERS

    if GRADER_ENV not in os.environ:
        return None
    name = os.environ[GRADER_ENV].strip() or "math_verify"
    if name not in GRADERS:
        raise ValueError(
            f"{GRADER_ENV}={os.environ[GRADER_ENV]!r} is unknown; choose one of {', '.join(GRADERS)}"
        )
    return name


def _numbers(value: Any) -> list[float]:
    items = value if isinstance(value, list | tuple) else [value]
    return [v for v in items if isinstance(v, float)]


def check_numbers(args: Any) -> None:
    """No number flag is NaN (every comparison with it is false: ``--actor.entropy_coef nan`` trained with
    a NaN loss term), and ``--actor.entropy_coef`` is finite. Flat namespace (right after parsing)."""
    for key, value in sorted(vars(args).items()):
        if any(math.isnan(v) for v in _numbers(value)):
            raise ValueError(f"--{key} nan: not a number; give a finite value")
    coef = _get(args, "actor.entropy_coef")
    if coef is not None and not math.isfinite(float(coef)):
        raise ValueError(
            f"--actor.entropy_coef {coef}: must be finite (0 logs the entropy without training on it)"
        )


#: --logprobs.chunk_mib above this (1 TiB) is no budget any GPU has.
MAX_CHUNK_MIB = 2**20


def check_chunk_budget(args: Any) -> None:
    """``--logprobs.chunk_mib`` at most :data:`MAX_CHUNK_MIB` (the lower bound: ``logprobs_path``)."""
    budget = _get(args, "logprobs.chunk_mib")
    if budget is not None and int(budget) > MAX_CHUNK_MIB:
        raise ValueError(
            f"--logprobs.chunk_mib {budget}: at most {MAX_CHUNK_MIB} (1 TiB); it bounds one chunk's logits "
            "temporaries, which never exceed 8 bytes x tokens x vocabulary anyway"
        )


#: The extensions OpenRLHF's blending_datasets reads as a local data file.
DATA_FILES = (".json", ".jsonl", ".csv", ".parquet", ".arrow", ".py")


def check_data(args: Any, dry_run: bool = False) -> str | None:
    """Each local file of ``--data.prompt_dataset`` (a comma list; ``NAME@DIR``) exists: a typo is one
    line naming it now, not a dead trainer after Ray started. A ``--dry-run`` (the plan of a run whose
    data is not prepared yet) says so in a note instead."""
    for item in str(_get(args, "data.prompt_dataset") or "").split(","):
        path = item.split("@")[0].strip()
        local = path.lower().endswith(DATA_FILES) or _looks_like_path(path)
        if path and local and not os.path.exists(os.path.expanduser(path)):
            problem = f"--data.prompt_dataset {path}: no such file or folder"
            if not dry_run:
                raise ValueError(problem)
            return f"{problem} (the run itself would stop here)"
    return None


def check_outputs(args: Any) -> None:
    """--ckpt.path and --ckpt.output_dir (the final model) are new, empty or rpg-train's (its mark, or
    the files of today's runs: rpg_checkpoints.json, rpg_run.json, OpenRLHF's _actor/); nothing is
    written here."""
    from rpg_openrlhf.common.atomic import check_dir

    ckpt = _get(args, "ckpt.path")
    for flag, default in OPENRLHF_DEFAULTS.items():  # OpenRLHF's defaults (./ckpt) are rpg-train's own
        value = _get(args, flag)
        if value and os.path.normpath(value) != os.path.normpath(default):
            check_dir(value, "rpg-train", f"--{flag}", CKPT_MARKS, allowed=[ckpt] if ckpt else [])


def mark_output_dir(args: Any) -> None:
    """After the dry run, before Ray: make --ckpt.output_dir (the final model's folder) and mark it."""
    from rpg_openrlhf.common.atomic import mark

    value = _get(args, "ckpt.output_dir")
    if value and os.path.normpath(value) != os.path.normpath(OPENRLHF_DEFAULTS["ckpt.output_dir"]):
        mark(value, "rpg-train")


#: OpenRLHF's defaults of the two output flags (the default ckpt.path lies inside the output_dir).
OPENRLHF_DEFAULTS = {"ckpt.path": "./ckpt/checkpoints_ppo_ray", "ckpt.output_dir": "./ckpt"}


#: What marks a --ckpt.path written before the ownership mark (resumed as before).
CKPT_MARKS = ("rpg_checkpoints.json", "rpg_run.json", "rpg_run.lock", "_actor")


def check_all(args: Any, dry_run: bool = False) -> list[str]:
    """Every check above plus the run-length and Schedule-Free ones; returns log lines."""
    from rpg_openrlhf.extras import run_length, run_settings
    from rpg_openrlhf.plugin import ref_refresh, schedule_free

    check_numbers(args)
    check_chunk_budget(args)
    run_settings.named_changes(args)  # --rpg.resume_changes: names that are settings
    notes = [check_model(args)]
    check_reward_source(args)
    check_reward_files(args)
    notes += [note] if (note := check_data(args, dry_run)) else []
    check_outputs(args)
    check_async_queue(args)
    check_correction(args)
    grader = check_reward_grader()
    if grader is not None:
        notes.append(f"reward grader RPG_REWARD_GRADER={grader} (forwarded to every Ray worker)")
    run_length.validate(args)
    schedule_free.validate(args)
    ref_refresh.validate(args)  # a reference refresh with DeepSpeed tensor parallelism
    return notes
