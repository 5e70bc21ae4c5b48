"""The training side of checkpoints: before OpenRLHF's save (in place, the workers' own rotation off)
the trainer records the tag in :data:`SAVING` and removes its markers; after it, writes the markers
and rotates as OpenRLHF would, complete checkpoints only. Before Ray, :func:`prepare` locks the run,
removes the torn tags the record names and points DeepSpeed's ``latest`` at the newest complete one."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

from rpg_openrlhf.common import checkpoints as ck
from rpg_openrlhf.common import seam
from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.args import rpg_enabled, set_value
from rpg_openrlhf.common.atomic import atomic_write, mark, take_lock, write_file
from rpg_openrlhf.extras import hold, run_length, run_settings
from rpg_openrlhf.extras.part import TrainerPart

SAVING = "rpg_saving.json"  # in --ckpt.path: the tags begun and not committed
LOCK_FILE = "rpg_run.lock"
REFERENCE_DIR = "_rpg_reference"  # the RPG reference weights of each checkpoint: <tag>.pt
TOKEN_KEY = "ckpt.rpg_run_lock"  # in the trainer's args: the token its driver wrote into the lock file
COMMITTED_KEY = "ckpt.rpg_committed"  # in the workers' args: the trainer commits and rotates
FLAG = "--ckpt.path"
_HELD: dict[str, tuple[FileLock, str]] = {}  # lock file -> (lock, token) held by this process


# ----------------------------------------------------------------------------- one run per --ckpt.path
class RunStopped(RuntimeError):
    """The driver that started this trainer no longer holds the run's lock: nothing more is written."""


def acquire(args: Any, run_dir: str | Path) -> None:
    """Hold ``run_dir``'s lock for this process's life; the token for :func:`fence` goes into ``args``."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    path = str((Path(run_dir) / LOCK_FILE).resolve())
    if path not in _HELD or not _HELD[path][0].is_locked:
        _HELD[path] = (take_lock(path, "rpg-train", run_dir, FLAG), secrets.token_hex(8))
        Path(path).write_text(json.dumps({"pid": os.getpid(), "token": _HELD[path][1]}))
    set_value(args, TOKEN_KEY, _HELD[path][1])


def release_all() -> None:
    """The driver stops: its trainer commits nothing more."""
    for lock, _ in _HELD.values():
        lock.release(force=True)
    _HELD.clear()


def fence(args: Any) -> None:
    """In the trainer: RunStopped unless the lock is held with the token its driver handed over."""
    token = _get(args, TOKEN_KEY)
    if token is None:
        return
    path, holder = Path(_get(args, "ckpt.path")) / LOCK_FILE, None
    with contextlib.suppress(OSError), open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # granted: nobody holds it
        except BlockingIOError:
            holder = ck.read_json(path).get("token")
    if holder != token:
        raise RunStopped(
            f"{FLAG} {path.parent}: the rpg-train run that started this trainer no longer holds {LOCK_FILE} (it stopped or died); no further checkpoint is written"
        )


# ----------------------------------------------------------------------------- the tags being written
def being_written(run_dir: str | Path, tags: set[str] | None = None) -> set[str]:
    """The tags recorded as begun and not committed (``tags``: record these)."""
    if tags is not None:
        write_file(Path(run_dir) / SAVING, json.dumps({"format": 1, "tags": sorted(tags)}))
    tags = ck.read_json(Path(run_dir) / SAVING).get("tags")
    return {t for t in tags if isinstance(t, str)} if isinstance(tags, list) else set()


def tag_dirs(run_dir: str | Path, tag: str) -> tuple[Path, Path]:
    """(DeepSpeed's folder, the Hugging Face folder) of ``tag``."""
    return Path(run_dir) / ck.ACTOR_DIR / tag, Path(run_dir) / f"{tag}{ck.HF_SUFFIX}"


def commit(run_dir: str | Path, tag: str, global_step: int) -> bool:
    """Mark ``tag`` complete where it lies: the Hugging Face folder, then DeepSpeed's (the commit).
    False when DeepSpeed's is absent (``--ckpt.disable_ds``, or a best save OpenRLHF skipped)."""
    for directory in reversed(tag_dirs(run_dir, tag)):
        if directory.is_dir():
            ck.write_marker(directory, tag, global_step)
    return tag_dirs(run_dir, tag)[0].is_dir()


# ----------------------------------------------------------------------------- the trainer's side
class ReferenceFiles:
    """The RPG reference weights beside the checkpoints: hard-linked while unchanged, pruned with their tags."""

    def __init__(self, ckpt_path: str) -> None:
        self.dir, self.actor_dir = Path(ckpt_path, REFERENCE_DIR), Path(ckpt_path, ck.ACTOR_DIR)
        self.last: tuple[str, int] | None = None  # (path, refresh step) written or loaded last

    def write(self, tag: str, refresh_step: int, state_dict: Any) -> str:
        import torch

        path, last = self.dir / f"{tag}.pt", self.last
        self.dir.mkdir(parents=True, exist_ok=True)
        self.last = (str(path), refresh_step)
        if last is not None and last[1] == refresh_step and os.path.isfile(last[0]):  # unchanged
            with contextlib.suppress(OSError):  # a hard link (no second gather), where the disk has them
                if last[0] != str(path):
                    path.unlink(missing_ok=True)
                    os.link(last[0], path)
                return str(path)
        with atomic_write(path, "wb", tmp=f"{path.name}.tmp") as f:
            torch.save({"refresh_step": refresh_step, "state_dict": state_dict()}, f)
        return str(path)

    def prune(self, keep: str) -> None:
        """Remove the files of tags rotated out of ``_actor`` (none when it is on another node)."""
        if self.actor_dir.is_dir() and self.dir.is_dir():
            tags = set(os.listdir(self.actor_dir))
            for p in [*self.dir.glob("*.pt"), *self.dir.glob("*.pt.tmp")]:
                if p.name != keep and p.name.split(".pt")[0] not in tags:
                    p.unlink(missing_ok=True)

    def path(self, name: str | None) -> str | None:
        return str(self.dir / name) if name else None

    def load(self, path: str) -> dict[str, Any]:
        import torch

        payload = torch.load(path, map_location="cpu", weights_only=True)
        self.last = (path, int(payload["refresh_step"]))
        return payload


class CheckpointStore(TrainerPart):
    """One trainer's checkpoints: a tag begun before OpenRLHF's save, committed after it."""

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        self.path = args.ckpt.path
        self.references = ReferenceFiles(args.ckpt.path)

    def begin(self, tag: str) -> None:
        """The run still holds its lock; the tag recorded as being written, its markers removed."""
        fence(self.args)
        being_written(self.path, being_written(self.path) | {tag})
        for directory in tag_dirs(self.path, tag):  # DeepSpeed's first: it is the commit
            (directory / ck.MARKER).unlink(missing_ok=True)

    def commit(self, tag: str, global_step: int) -> None:
        """After every rank wrote ``tag``: markers, rotation; no longer being written."""
        fence(self.args)
        hold.hold("commit", global_step)
        if commit(self.path, tag, global_step):
            c = self.args.ckpt
            removed = rotate(self.path, tag, getattr(c, "max_num", None), getattr(c, "max_mem", None))
            from openrlhf.utils.logging_utils import init_logger

            why = f"; removed {', '.join(removed)} (--ckpt.max_num/--ckpt.max_mem)" if removed else ""
            init_logger(__name__).info(f"[rpg] checkpoint: committed {tag}{why}")
        being_written(self.path, being_written(self.path) - {tag})


def _metric(tag_dir: Path) -> float | None:  # OpenRLHF's _read_ckpt_metric
    try:
        return float(ck.read_json(tag_dir / "metric.json")["metric_value"])
    except (KeyError, ValueError, TypeError):
        return None


def _size(tag_dir: Path) -> int:
    return sum(p.stat().st_size for p in tag_dir.rglob("*") if p.is_file() and p.name != ck.MARKER)


def rotate(run_dir: str | Path, new_tag: str, max_num: int | None, max_mem_gib: float | None) -> list[str]:
    """OpenRLHF's rotation (seam ``checkpoint_rotation``) after ``new_tag``'s commit, over complete
    checkpoints only: a new best removes the other best; then regular ones (no metric, the worst, the
    oldest first) while over ``max_num`` (not for a best save) or ``max_mem_gib``."""
    dirs = [d for d in _named(Path(run_dir) / ck.ACTOR_DIR) if d.is_dir() and ck.is_complete(d)]
    is_best = new_tag.startswith("best")
    removed = [d for d in dirs if is_best and d.name.startswith("best") and d.name != new_tag]
    limit = math.inf if max_mem_gib is None else max_mem_gib * 1024**3
    while True:
        others = [d for d in dirs if d.name != new_tag and d not in removed]
        regular = [d for d in others if not d.name.startswith("best")]
        over_num = not is_best and max_num is not None and len(regular) + 1 > max_num  # with new_tag
        if not regular or not (over_num or sum(map(_size, others)) > limit):
            break
        m = {d: _metric(d) for d in regular}
        removed.append(min(regular, key=lambda d: (m[d] is not None, m[d] or 0.0, d.stat().st_mtime)))
    for d in removed:
        shutil.rmtree(d)
    return [d.name for d in removed]


class CheckpointCommitMixin:
    """Every rpg-train trainer's checkpoint hooks: the step budget, the store, the trainer's part
    (``checkpoint_part()``: ``add_to_checkpoint``, ``after_checkpoint``, ``restore``)."""

    def save_logs_and_checkpoints(
        self, global_step: int, logs_dict: Any = None, client_states: Any = None
    ) -> None:
        budget = run_length.StepBudget.of(self)
        last = budget.is_last(global_step)
        client_states = {} if client_states is None else client_states  # one dict: fit() reuses it
        # the step of --rpg.max_steps always saves (OpenRLHF decides from ckpt.save_steps: seam save_steps)
        with seam.swapped(self.args.ckpt, save_steps=1) if last else contextlib.nullcontext():
            saving = global_step % self.args.ckpt.save_steps == 0
            with self._saving(f"global_step{global_step}", global_step, client_states, saving):
                super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        if last:
            budget.reached()

    def save_best_checkpoint(self, eval_metrics: Any, global_step: int, client_states: Any = None) -> Any:
        """OpenRLHF's (a new best, or nothing: then nothing is marked), begun and committed around it."""
        client_states = {} if client_states is None else client_states
        with self._saving(f"best_global_step{global_step}", global_step, client_states, bool(eval_metrics)):
            return super().save_best_checkpoint(eval_metrics, global_step, client_states)

    @contextlib.contextmanager
    def _saving(self, tag: str, global_step: int, client_states: dict, saving: bool) -> Iterator[None]:
        """Around OpenRLHF's save of ``tag`` (when ``saving``): begun, the part's files, committed."""
        if not saving:
            yield
            return
        store, part = CheckpointStore.of(self), getattr(self, "checkpoint_part", lambda: None)()
        store.begin(tag)
        if part is not None:
            part.add_to_checkpoint(store, client_states, tag)
        yield
        if part is not None:
            part.after_checkpoint(store, client_states)
        store.commit(tag, global_step)

    def init_checkpoint_states(self) -> dict:
        states = super().init_checkpoint_states()
        part = getattr(self, "checkpoint_part", lambda: None)()
        if part is not None:
            part.restore(CheckpointStore.of(self), states)
        return states


# ----------------------------------------------------------------------------- the policy workers' side
def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def rng_file(ckpt_path: str, tag: str, rank: int) -> str:
    return os.path.join(ckpt_path, ck.ACTOR_DIR, tag, f"rpg_rng_rank{rank}.pt")


class WorkerCheckpointMixin:
    """Policy actor mixin: OpenRLHF's rotation off during the save (seam ``save_rotation_off``), and each
    rank's torch RNG state (OpenRLHF shuffles micro-batches with it) saved and restored on resume."""

    def save_checkpoint(self, tag: str, *args: Any, **kwargs: Any) -> Any:
        import torch

        state = {"cpu": torch.get_rng_state()}  # before saving: what the next step starts from
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        ckpt = self.strategy.args.ckpt
        off = {"max_num": math.inf, "max_mem": math.inf} if _get(self.strategy.args, COMMITTED_KEY) else {}
        with seam.swapped(ckpt, **off):
            result = super().save_checkpoint(tag, *args, **kwargs)
        if not ckpt.disable_ds:
            torch.save(state, rng_file(ckpt.path, tag, _rank()))
        return result

    def init_model_from_pretrained(self, strategy: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        result = super().init_model_from_pretrained(strategy, *args, **kwargs)
        ckpt = strategy.args.ckpt
        if ckpt.load_enable and self.checkpoint_states:  # OpenRLHF loaded a checkpoint
            path = rng_file(ckpt.path, _read_latest(Path(ckpt.path, ck.ACTOR_DIR)) or "", _rank())
            if not os.path.exists(path):
                strategy.print(f"[rpg] checkpoint: no RNG state in {os.path.dirname(path)} (written before)")
                return result
            state = torch.load(path, weights_only=True)
            torch.set_rng_state(state["cpu"])
            if "cuda" in state and torch.cuda.is_available():
                torch.cuda.set_rng_state(state["cuda"])
        return result


def use_worker_checkpoint_actor(module: Any) -> None:
    """The seam's ``rng_state_actor`` patch: the current ``PolicyModelActor`` with the mixin in front."""
    from rpg_openrlhf.extras.policy_actor import prepend_mixin

    prepend_mixin(module, WorkerCheckpointMixin)


# ----------------------------------------------------------------------------- driver side, before Ray
def _named(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if ck.tag_step(p.name) is not None) if folder.is_dir() else []


def _read_latest(actor: Path) -> str | None:
    try:
        return (actor / "latest").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def torn(run_dir: Path) -> list[Path]:
    """Every torn checkpoint folder of ``run_dir`` (DeepSpeed's and Hugging Face's), by step."""
    found = _named(run_dir / ck.ACTOR_DIR) + [d for d in _named(run_dir) if d.name.endswith(ck.HF_SUFFIX)]
    bad = [d for d in found if d.is_dir() and ck.state(d, run_dir) == "torn"]
    return sorted(bad, key=lambda d: (ck.tag_step(d.name), d.name))


def last_complete(run_dir: str | Path) -> str | None:
    """The tag to resume: ``latest`` when it is not torn, else the newest that is not (a regular tag
    before a best one of its step); None when there is none."""
    actor = Path(run_dir) / ck.ACTOR_DIR
    tags = [d.name for d in _named(actor) if d.is_dir() and ck.state(d, run_dir) != "torn"]
    latest = _read_latest(actor)
    newest = max(tags, key=lambda t: (ck.tag_step(t), not t.startswith("best")), default=None)
    return latest if latest in tags else newest


def last_complete_dir(args: Any) -> str | None:
    """The DeepSpeed folder a resume of this run would load now, or None."""
    tag = last_complete(_get(args, "ckpt.path"))
    return str(Path(_get(args, "ckpt.path"), ck.ACTOR_DIR, tag)) if tag else None


def _refuse_in_the_way(run_dir: Path, start: int) -> None:
    """Refuse what the run did not write (neither complete nor recorded) where it saves: a tag after
    ``start``, or a best one in ``_actor`` (OpenRLHF removes the others when it saves a new best)."""
    writing, actor = being_written(run_dir), run_dir / ck.ACTOR_DIR
    found = [
        d.relative_to(run_dir).as_posix()
        for d in _named(actor) + _named(run_dir)
        if (ck.tag_step(d.name) > start or (d.parent == actor and d.name.startswith("best")))
        and not (d.is_dir() and (ck.is_complete(d) or d.name.removesuffix(ck.HF_SUFFIX) in writing))
    ]
    if found:
        raise ValueError(
            f"{FLAG} {run_dir}: {', '.join(found)} not written by this run (no completeness marker) where the run saves the steps after {start}; it would be written into: move it out of {FLAG}, or use another {FLAG}"
        )


def _remove_killed_saves(run_dir: Path) -> list[str]:
    """Remove the torn folders the record names (no marker: a save a kill stopped)."""
    writing, names = being_written(run_dir), set()
    for d in torn(run_dir):
        if (name := d.name.removesuffix(ck.HF_SUFFIX)) in writing and not (d / ck.MARKER).exists():
            shutil.rmtree(d)
            names.add(name)
    if writing:
        being_written(run_dir, writing - names)
    removed = f"save(s) stopped before their commit left their files in {run_dir}: removed ({', '.join(sorted(names))})"
    return [removed] if names else []


def _select(run_dir: Path) -> list[str]:
    """Point ``latest`` at the last complete checkpoint; with none, clear ``_actor`` (OpenRLHF fails on
    one without a checkpoint); torn folders the run did not write are left in place."""
    actor, notes = run_dir / ck.ACTOR_DIR, []
    bad, keep, was = torn(run_dir), last_complete(run_dir), _read_latest(actor)
    if bad:
        notes.append(
            f"incomplete checkpoint(s) in {run_dir} passed over and left in place (a completeness marker whose files changed since, or a folder this run did not write): {', '.join(d.name for d in bad)}"
        )
    if keep is None:
        for name in ("latest", "zero_to_fp32.py"):  # what DeepSpeed writes beside the tags
            (actor / name).unlink(missing_ok=True)
        if others := ", ".join(sorted(os.listdir(actor))):
            raise ValueError(
                f"{actor}: no complete checkpoint to resume, but it holds what the run did not write ({others}); move them away, or use another {FLAG}"
            )
        actor.rmdir()
        return notes + [f"no complete checkpoint in {run_dir}: starting from step 0"] * bool(bad or was)
    if keep != was:
        write_file(actor / "latest", keep)
    return notes + [f"resuming from {keep} (the last complete checkpoint in {run_dir})"]


def prepare(args: Any) -> list[str]:
    """Driver side, before Ray: lock, refuse what is in the way or other settings, declare the markers,
    remove what a killed save left, select the checkpoint to resume. The lines to log."""
    saves = _get(args, "ckpt.save_steps", -1) != -1 or _get(args, "rpg.max_steps") is not None
    if not saves and not _get(args, "ckpt.load_enable"):
        return []
    run_dir = Path(_get(args, "ckpt.path"))
    acquire(args, run_dir)
    mark(run_dir, "rpg-train")
    if _get(args, "train.async_enable") and not rpg_enabled(args):
        return []  # OpenRLHF's own async trainer (stock --train.async_enable) writes and reads them
    resuming = bool(_get(args, "ckpt.load_enable")) and (run_dir / ck.ACTOR_DIR).is_dir()
    tag = last_complete(run_dir) if resuming else None
    _refuse_in_the_way(run_dir, ck.tag_step(tag) if tag else 0)
    notes = run_settings.check(args, run_dir, tag is not None)  # before anything changes here
    if ck.declared_since(run_dir) is None:  # a run from before markers: trusted up to the one resumed
        steps = {d.name: ck.tag_step(d.name) for d in _named(run_dir / ck.ACTOR_DIR)} if resuming else {}
        ck.declare(
            run_dir, steps.get(_read_latest(run_dir / ck.ACTOR_DIR) or "", max(steps.values(), default=0))
        )
    notes += _remove_killed_saves(run_dir)
    if resuming:
        notes += _select(run_dir)
    set_value(args, COMMITTED_KEY, True)
    return notes
