"""What defines a run, recorded at its first start and checked on every resume (driver side, before Ray).

OpenRLHF resumes (``--ckpt.load_enable``) from the checkpoint whatever the flags now say: continuing a
``urkl`` run with ``--rpg.loss fkl`` or another ``--train.seed`` trained and committed the next step
with the new settings, one run's steps mixed with another's. So the settings that define what is
trained go into ``<ckpt.path>/`` :data:`FILE` (atomic) when the run first starts, and a start with
``--ckpt.load_enable`` that has a complete checkpoint to resume is refused, one line naming each
setting that differs, before anything is written or removed.

Defining (:func:`defining`): what is trained (the ``--rpg.*``, ``--algo.*``, ``--reward.*``, ``--data.*``,
``--rollout.*``, ``--actor.*`` and ``--ds.lora.*`` flags, :data:`_TRAIN`, the grader ``RPG_REWARD_GRADER``).
May change on resume (:data:`MAY_CHANGE`, and every other section): the budget ``--rpg.max_steps`` (a
larger one continues a run), where checkpoints and logs go, and how the same computation is placed and
executed (speed and memory, not what is trained, up to floating-point summation order).

A change made on purpose (a resume that switches the off-policy correction, say) is named with
``--rpg.resume_changes NAME[,NAME...]``: those settings may differ, the others are still checked, and
the record takes the new values.

``--rpg.resume_changes`` names are checked (``rpg-train``'s preflight): a name that is no setting is refused
with the closest ones. A run started by an older version has no record, and a record can be lost: a
resume then says so in a warning and writes it (checked from then on); a record that is not a regular
file, not JSON or of another shape is refused.
A start without ``--ckpt.load_enable`` is a new run: its settings replace the record.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.atomic import atomic_write
from rpg_openrlhf.common.inputs import InputFileError, open_input

FILE = "rpg_run.json"
FORMAT = 1
#: Environment variables that define the run (read by the reward function in the workers).
ENV = ("RPG_REWARD_GRADER",)

_PREFIXES = ("rpg.", "algo.", "reward.", "data.", "rollout.", "actor.", "ds.lora.")
_TRAIN = ("train.seed", "train.batch_size", "train.num_episodes", "train.max_epochs", "train.enable_ema",
          "train.ema_beta", "train.async_enable", "train.partial_rollout_enable", "train.agent_func_path")  # fmt: skip
#: Settings under the prefixes above that may change on resume (placement, budget, throughput).
MAY_CHANGE = (
    "rpg.max_steps", "rpg.capture_dir", "rpg.resume_changes", "reward.num_nodes", "reward.num_gpus_per_node", "reward.offload",
    "data.dataloader_num_workers", "rollout.micro_batch_size", "rollout.vllm_generate_batch_size",
    "rollout.max_tokens_per_gpu", "actor.num_nodes", "actor.num_gpus_per_node",
    "actor.gradient_checkpointing_enable", "actor.gradient_checkpointing_reentrant",
)  # fmt: skip


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested namespaces -> ``{"section.name": value}`` (flat namespaces: their dotted names)."""
    if isinstance(value, argparse.Namespace | SimpleNamespace):
        out: dict[str, Any] = {}
        for k, v in vars(value).items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.removesuffix("."): value}


def defining(args: Any) -> dict[str, Any]:
    """The settings that define the run (flat ``section.name`` -> JSON value), and the grader variable."""
    # JSON round trip: tuples become lists, DefaultFloat/DefaultStr their values, others their str()
    flat = json.loads(json.dumps(_flat(args), default=str))
    out = {
        k: v
        for k, v in flat.items()
        if (k.startswith(_PREFIXES) or k in _TRAIN)
        and k not in MAY_CHANGE
        and not k.endswith("_after_commit")
    }
    out.update({f"env.{name}": os.environ.get(name) for name in ENV})
    return dict(sorted(out.items()))


def recorded(run_dir: str | Path) -> dict[str, Any] | None:
    """The recorded settings of ``run_dir``, None when there are none (a new run, an older version's);
    ValueError when the file is not one this tool wrote (a directory at its name, not JSON, another shape)."""
    path = Path(run_dir) / FILE
    try:
        with open_input(path) as f:  # a folder or FIFO at the name: refused, not read
            body = json.loads(f.read().decode("utf-8"))
    except InputFileError as e:
        if not path.exists():
            return None
        raise ValueError(
            f"{e}; it is not the run record rpg-train writes: remove it or use another --ckpt.path"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f"{path}: unreadable ({type(e).__name__}); restore it or use another --ckpt.path"
        ) from None
    if not (
        isinstance(body, dict) and body.get("format") == FORMAT and isinstance(body.get("settings"), dict)
    ):
        raise ValueError(
            f"{path}: not a run record written by rpg-train; restore it or use another --ckpt.path"
        )
    return body["settings"]


def record(run_dir: str | Path, settings: dict[str, Any]) -> None:
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with atomic_write(Path(run_dir) / FILE) as f:
        json.dump({"format": FORMAT, "settings": settings}, f, indent=1, sort_keys=True)


def named_changes(args: Any) -> set[str]:
    """The defining settings ``--rpg.resume_changes`` names (``--rpg.loss``, ``rpg.loss``,
    ``RPG_REWARD_GRADER``), as :func:`defining` keys; ValueError naming a name that is no setting (a typo,
    ``*``, a made-up one), with the closest. A setting that may change on resume anyway is accepted."""
    import difflib

    text = _get(args, "rpg.resume_changes") or ""
    keys = defining(args)
    flags = set(_flat(args))
    out = set()
    for name in (n.strip() for n in str(text).split(",")):
        if not name:
            continue
        key = f"env.{name}" if name in ENV else name.removeprefix("--")
        if key in keys:
            out.add(key)
        elif key not in flags:
            shown = [k.removeprefix("env.") if k.startswith("env.") else f"--{k}" for k in keys]
            close = difflib.get_close_matches(name if name in ENV else f"--{key}", shown, n=3, cutoff=0.6)
            raise ValueError(
                f"--rpg.resume_changes: {name!r} is not a setting of rpg-train"
                + (f" (closest: {', '.join(close)})" if close else "")
                + "; name the flags that define the run as --rpg.loss,--train.seed and the grader as RPG_REWARD_GRADER"
            )
    return out


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def differences(was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``--flag OLD (now NEW)`` for each setting recorded in both that differs (a setting a newer
    version added is not in an older record: not compared)."""
    return [
        f"{k.removeprefix('env.') + '=' if k.startswith('env.') else f'--{k} '}{_value(was[k])} (now {_value(now[k])})"
        for k in sorted(was.keys() & now.keys())
        if was[k] != now[k]
    ]


def check(args: Any, run_dir: str | Path, resuming: bool) -> list[str]:
    """Refuse (ValueError, one line) a resume whose defining settings differ from the record; write the
    record for a new run, or where none was left (said). Returns the lines to log."""
    now = defining(args)
    was = recorded(run_dir)
    path = Path(run_dir) / FILE
    if resuming and was is None:
        record(run_dir, now)
        return [f"warning: {path} is missing: the settings of the run that wrote these checkpoints are unknown, "
                "so this resume's could not be compared with them; recorded now (checked from the next resume on)"]  # fmt: skip
    if resuming:
        allowed = named_changes(args)
        changed = differences({k: v for k, v in was.items() if k not in allowed}, now)
        if changed:
            raise ValueError(
                f"--ckpt.load_enable: the run in {run_dir} was started with other settings: {'; '.join(changed)}. "
                f"Resume with the run's own settings ({path}), or start a new run with another "
                "--ckpt.path (what may change on resume: --rpg.max_steps, --ckpt.*, --logger.*, --eval.*, and "
                "placement: GPUs, engines, --vllm.*, --ds.*, micro-batch sizes; a change made on purpose: "
                "--rpg.resume_changes NAME,...)"
            )
        notes = []
        if not was.keys() & now.keys():
            notes.append(f"warning: {path} records none of the run's settings (emptied?): nothing could be "
                         "compared; this resume's settings are recorded now")  # fmt: skip
        made = differences({k: v for k, v in was.items() if k in allowed}, now)
        if made:
            notes.append(
                f"resumed with the changes --rpg.resume_changes names ({'; '.join(made)}): {path} records them"
            )
        if was != now:
            record(run_dir, now)
        return notes
    record(run_dir, now)
    return [] if was is None or was == now else [f"new run: {path} records its settings"]
