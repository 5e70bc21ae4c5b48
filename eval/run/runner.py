"""Batch evaluation of checkpoints through lm-eval, with resume.

For every checkpoint (sorted by step) and benchmark, problems are evaluated in chunks of
``chunk`` problems, each chunk one ``lm_eval.simple_evaluate`` call on the already loaded
model (``samples=`` selects the problems).  After each chunk its records (one per sample)
are appended to ``<out>/samples.jsonl`` atomically.  On restart the torn tail (if any) is
cut, finished (checkpoint, benchmark) units are skipped without loading the model, and in
partial units only problems that lack samples are generated again; per-problem seeding
(lm_models.py) makes them identical to what the interrupted run would have produced, and
only the missing sample indices are appended.  Records carry no timestamps, so a resumed
run's records equal an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import hold_lock, kind
from rpg_openrlhf.common.inputs import InputFileError

from .. import outdir
from .. import records as rec
from ..data import BENCHMARKS, HUB_DEFAULTS, Problem, load_benchmark, select
from ..graders import DEFAULT_TIMEOUT, GRADER_VERSION, MAX_ANSWER_CHARS
from ..limits import MAX_N, MIN_TEMPERATURE
from ..outputs import read_input
from .checkpoints import Checkpoint, checkpoint_holding, find_checkpoints, why_incomplete
from .prompts import PROMPT_STYLES, uses_chat_template
from .taskgen import check_benchmark_name, task_name, write_tasks

SAMPLES = "samples.jsonl"
# Settings that shape a record; a resume must not change them once records exist (outdir.py).
FINGERPRINT_KEYS = ("run", "n", "max_tokens", "temperature", "top_p", "seed", "prompt_style", "backend")
# --model-arg keys that only change speed or memory, not the samples: left out of the fingerprint.
NON_SAMPLING_MODEL_ARGS = frozenset({"gpu_memory_utilization", "batch_size", "max_batch_size"})
# --model-arg keys rpg-eval sets itself: key -> what to do instead (both backends, then the hf one's).
RESERVED_MODEL_ARGS = {
    "pretrained": "the model is each checkpoint of --checkpoints",
    "device": "use --device",
    "seed": "use --seed",
    "sample_seed": "use --seed",
    "max_gen_toks": "use --max-tokens",
    "progress": "rpg-eval sets it",
}
RESERVED_BY_HF = {
    "batch_size": "the hf backend generates a problem's --n samples as one batch (batch_size = --n), "
    "so its samples do not depend on batching: drop it",
}
_DEVICE_RE = re.compile(r"cpu|cuda(?::(\d+))?|mps")


@dataclass
class RunConfig:
    """Options of ``rpg-eval run`` (see docs/eval.md)."""

    checkpoints: str
    out: str
    benchmarks: list[str] = field(default_factory=lambda: list(BENCHMARKS))
    n: int = 32
    backend: str = "hf"
    data_dir: str | None = None
    data_files: dict[str, str] = field(default_factory=dict)
    limit: int | None = None
    max_tokens: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    prompt_style: str = "boxed"
    grader: str = "math_verify"
    run: str | None = None
    chunk: int = 8
    ray: bool = False
    device: str | None = None
    final_step: int | None = None
    exclude_step0: bool = False
    model_args: dict[str, Any] = field(default_factory=dict)
    summarize: bool = True
    allow_fallback: bool = False

    def validate(self) -> None:
        """Reject bad options early with a clear message (before any model loads or file is written)."""
        self._validate_benchmarks()
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"--prompt-style must be one of {PROMPT_STYLES}")
        if self.backend not in ("hf", "vllm"):
            raise ValueError("--backend must be hf or vllm")
        if self.grader not in ("math_verify", "paper"):
            raise ValueError("--grader must be math_verify or paper")
        self._validate_numbers()
        self._validate_model_args()
        if self.device is not None:
            check_device(self.device, self.backend)

    def _validate_benchmarks(self) -> None:
        """Benchmark names, their data files and --data-dir: local paths must exist (a mistyped one
        is not a hub dataset id), and every --data NAME is one of --benchmarks."""
        # A custom benchmark (any other name) is accepted when its file is given with --data NAME=FILE:
        # it has no hub default, and a --data-dir lookup by name would be a guess.
        bad = [b for b in self.benchmarks if b not in BENCHMARKS and not self.data_files.get(b)]
        if bad:
            raise ValueError(
                f"unknown benchmarks {bad}; choose from {BENCHMARKS} or give a custom benchmark's "
                "file with --data NAME=FILE.jsonl"
            )
        if not self.benchmarks:
            raise ValueError("--benchmarks: no benchmark given")
        for b in self.benchmarks:
            check_benchmark_name(b)
        unused = [name for name in self.data_files if name not in self.benchmarks]
        if unused:
            raise ValueError(
                f"--data {unused[0]}=...: {unused[0]!r} is not in --benchmarks ({','.join(self.benchmarks)}); "
                "add it to --benchmarks or drop the --data"
            )
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise ValueError(f"--data-dir {self.data_dir}: no such file or directory")
        for name, path in self.data_files.items():
            if not Path(path).exists():
                raise ValueError(f"--data {name}={path}: no such file or directory")

    def _validate_numbers(self) -> None:
        ints = {"--n": (self.n, 1), "--max-tokens": (self.max_tokens, 1), "--chunk": (self.chunk, 1),
                "--seed": (self.seed, 0), "--limit": (self.limit, 1), "--final-step": (self.final_step, 0)}  # fmt: skip
        for flag, (value, low) in ints.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"{flag} must be an integer >= {low}, got {value!r}")
        if self.n > MAX_N:
            raise ValueError(f"--n must be <= {MAX_N}, got {self.n}")
        t = self.temperature
        if not (isinstance(t, int | float) and math.isfinite(t)) or t < 0 or 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"--temperature must be 0 or a finite number >= {MIN_TEMPERATURE:g}, got {t!r}")
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p!r}")

    def _validate_model_args(self) -> None:
        reserved = {**RESERVED_MODEL_ARGS, **(RESERVED_BY_HF if self.backend == "hf" else {})}
        for key in self.model_args:
            if key in reserved:
                raise ValueError(f"--model-arg {key}: rpg-eval sets it ({reserved[key]})")

    def fingerprint(self) -> dict[str, Any]:
        """What shapes a record besides data and checkpoints: {"settings", "grading"} (run.json)."""
        settings: dict[str, Any] = {k: getattr(self, k) for k in FINGERPRINT_KEYS}
        settings["model_args"] = {
            k: v for k, v in sorted(self.model_args.items()) if k not in NON_SAMPLING_MODEL_ARGS
        }
        grading = {
            "allow_fallback": self.allow_fallback,
            "grader_version": GRADER_VERSION,
            "timeout": DEFAULT_TIMEOUT,
            "max_answer_chars": MAX_ANSWER_CHARS,
        }
        return {"settings": settings, "grading": grading}


def check_device(device: str, backend: str) -> None:
    """--device: cpu, cuda, cuda:N (a GPU this machine has) or mps, for the hf backend."""
    if backend != "hf":
        raise ValueError(f"--device {device}: applies to --backend hf only (vLLM places the model itself)")
    m = _DEVICE_RE.fullmatch(device)
    if m is None:
        raise ValueError(f"--device {device}: not a device; use cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(m.group(1) or 0)
        if index >= count:
            have = f"GPUs 0..{count - 1}" if count else "no CUDA GPU"
            raise ValueError(f"--device {device}: this machine has {have}; use --device cpu or another index")


def _source(cfg: RunConfig, benchmark: str) -> str | None:
    return cfg.data_files.get(benchmark) or cfg.data_dir


def recorded_path(path: str | os.PathLike, out: str | os.PathLike) -> str:
    """A path as run.json and samples.jsonl keep it: relative to the run folder (--out), so a
    run folder read on another machine (results/ in a clone) names the same files. Runs written
    before this kept absolute paths; nothing reads them back but for display, so both read."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(out))


def load_problems(cfg: RunConfig) -> tuple[dict[str, list[Problem]], dict[str, dict[str, Any]]]:
    """The problems of each benchmark (first --limit), in the order lm-eval sees them, and for
    run.json each benchmark's source and content hash (of all its problems, not only the first N)."""
    problems, info = {}, {}
    for b in cfg.benchmarks:
        source = _source(cfg, b)
        every = load_benchmark(source, b)
        problems[b] = select(every, limit=cfg.limit)
        shown = recorded_path(source, cfg.out) if source else f"{HUB_DEFAULTS[b][0]} (hub)"
        info[b] = {"source": shown, "sha256": outdir.data_fingerprint(every), "problems": len(every)}
    return problems, info


def existing_samples(out: Path) -> dict[tuple[str, str, str], set[int]]:
    """(checkpoint, benchmark, problem_id) -> sample indices already recorded in ``out``."""
    done: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    if kind(out / SAMPLES) is not None:
        for r in rec.read(out / SAMPLES):
            done[(r["checkpoint"], r["benchmark"], r["problem_id"])].add(int(r["sample_index"]))
    return done


def _sampling(cfg: RunConfig) -> dict[str, Any]:
    return {
        "backend": cfg.backend,
        "n": cfg.n,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": 0,
        "max_tokens": cfg.max_tokens,
    }


def _check_records(
    cfg: RunConfig,
    path: Path,
    records: list[tuple[int, dict[str, Any]]],
    ckpts: list[Checkpoint],
    problems: dict[str, list[Problem]],
) -> None:
    """Each existing record must have been made the way this run makes them (a second line of
    defence behind run.json: every record carries its own settings)."""
    steps = {c.name: c.step for c in ckpts}
    golds = {(b, p.id): p.answer for b, ps in problems.items() for p in ps}
    want = {"run": cfg.run, "prompt_style": cfg.prompt_style, "seed": cfg.seed, "sampling": _sampling(cfg)}
    for lineno, r in records:
        checks = [(k, r.get(k), v) for k, v in want.items()]
        if r["checkpoint"] in steps:
            checks.append(("step", r["step"], steps[r["checkpoint"]]))
        gold = golds.get((r["benchmark"], str(r["problem_id"])))
        if gold is not None:
            checks.append(("gold", r.get("gold"), gold))
        for what, have, now in _differences(checks):
            if have != now:
                raise outdir.OutputDirError(
                    f"{path}:{lineno}: record ({r['checkpoint']}, {r['benchmark']}, problem {r['problem_id']}) "
                    f"was made with {what} {have!r}, this run has {now!r}; resume with the same settings "
                    "and data, or use another --out"
                )


def _differences(checks: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    """(field, recorded, now) triples, dicts split into their differing keys ("sampling.n")."""
    out = []
    for what, have, now in checks:
        if isinstance(have, dict) and isinstance(now, dict):
            out += [(f"{what}.{k}", have.get(k), now.get(k)) for k in sorted(set(have) | set(now))]
        else:
            out.append((what, have, now))
    return out


def _prepare_out(
    cfg: RunConfig,
    out: Path,
    ckpts: list[Checkpoint],
    problems: dict[str, list[Problem]],
    data: dict[str, Any],
) -> None:
    """Under the lock: check that ``od`` is ours and its records were made like this run's,
    write run.json, then (only then) cut what a killed writer left in samples.jsonl."""
    old = outdir.read_run_json(out)
    if old is None:
        outdir.check_ownership(out)  # again, now that no other run can be creating it
    path = out / SAMPLES
    records = rec.check_owned(path)
    recorded = {
        "checkpoints": {r["checkpoint"] for _, r in records},
        "benchmarks": {r["benchmark"] for _, r in records},
    }
    new = {
        "format": outdir.RUN_FORMAT,
        **cfg.fingerprint(),
        "data": data,
        "checkpoints": {
            c.name: {
                "path": recorded_path(c.path, out),
                "step": c.step,
                "sha256": outdir.checkpoint_fingerprint(c.path),
            }
            for c in ckpts
        },
    }
    meta = outdir.reconcile(out, old, new, recorded)
    _check_records(cfg, path, records, ckpts, problems)
    outdir.write_run_json(out, meta)
    cut, dropped, _ = rec.repair_counts(path)
    if cut:
        print(f"[rpg-eval] removed a torn trailing record ({cut} bytes) from {path}", file=sys.stderr)
    if dropped:
        print(f"[rpg-eval] dropped {dropped} torn record line(s) from {path}", file=sys.stderr)


def build_records(
    cfg: RunConfig,
    ckpt: Checkpoint,
    benchmark: str,
    example: dict,
    problem_index: int,
    count_tokens: Callable[[dict, int], list[int] | None] | None = None,
) -> list[dict[str, Any]]:
    """One record per sample from an lm-eval logged sample (all k responses of a problem);
    ``count_tokens(doc, k)``: the number of token ids the model generated for each response
    (``response_tokens``: a response of --max-tokens tokens ran out of tokens before its end)."""
    doc = example["doc"]
    fr = example["filtered_resps"]
    responses = fr[0] if fr and isinstance(fr[0], list) else fr
    v = json.loads(example["verdicts"])
    counted = count_tokens(doc, len(responses)) if count_tokens is not None else None
    tokens = counted if counted is not None else [None] * len(responses)
    out = []
    for j, text in enumerate(responses):
        out.append(
            {
                "run": cfg.run,
                "checkpoint": ckpt.name,
                "checkpoint_path": recorded_path(ckpt.path, cfg.out),
                "step": ckpt.step,
                "benchmark": benchmark,
                "task": task_name(benchmark, cfg.prompt_style),
                "problem_id": str(doc["id"]),
                "problem_index": problem_index,
                "sample_index": j,
                "prompt_style": cfg.prompt_style,
                "prompt_hash": example.get("prompt_hash"),
                "gold": str(doc["answer"]),
                "response": text,
                "extracted": {"math_verify": v["extracted_math_verify"][j], "paper": v["extracted_paper"][j]},
                "correct": {"math_verify": bool(v["math_verify"][j]), "paper": bool(v["paper"][j])},
                "error_math_verify": v["error_math_verify"][j],
                "seed": cfg.seed,
                "sampling": _sampling(cfg),
            }
        )
        if tokens[j] is not None:
            out[-1]["response_tokens"] = tokens[j]
    return out


def token_counter(lm: Any) -> Callable[[dict, int], list[int] | None] | None:
    """The number of token ids the model generated for each of a problem's k responses, as the
    backends note them (lm_models: ``generated_tokens``; not a re-encoding of the decoded text,
    which a tokenizer need not give back: 5-10 tokens for responses cut at 4), or None for a
    model that notes none."""
    from .lm_models import problem_key  # lm-eval is loaded by now: a model of it exists

    noted = getattr(lm, "generated_tokens", None)
    if not isinstance(noted, dict):
        return None

    def count(doc: dict, k: int) -> list[int] | None:
        got = noted.get(problem_key(doc))
        return list(got) if got is not None and len(got) == k else None

    return count


def _no_lm_eval_env_info() -> contextlib.AbstractContextManager:
    """Make lm-eval's add_env_info / get_git_commit_hash no-ops while the block runs (restored after).

    simple_evaluate calls both on every call (torch's collect_env and git subprocesses, ~0.3 s):
    23% of generation time in bench/eval_overhead.py, for results this runner never reads.
    Patched where simple_evaluate looks them up (lm_eval.evaluator's module globals)."""
    from unittest import mock

    import lm_eval.evaluator as ev

    return mock.patch.multiple(ev, add_env_info=lambda storage: None, get_git_commit_hash=lambda: None)


class ModelError(ValueError):
    """A checkpoint that cannot be evaluated (the message names it and what to change)."""


def evaluate_checkpoint(
    cfg_dict: dict[str, Any],
    ckpt: Checkpoint,
    problems: dict[str, list[Problem]],
) -> int:
    """Generate and record every missing sample of one checkpoint; returns records written (this may
    be another process than the driver, which holds the --out's lock)."""
    cfg = RunConfig(**cfg_dict)
    out = Path(cfg.out)
    done = existing_samples(out)
    todo: dict[str, list[int]] = {}
    for b, probs in problems.items():
        missing = [i for i, p in enumerate(probs) if len(done.get((ckpt.name, b, p.id), ())) < cfg.n]
        if missing:
            todo[b] = missing
    if not todo:
        return 0
    from tqdm.auto import tqdm

    for name in ("lm_eval", "lm-eval", "lm_eval.api.task", "lm_eval.evaluator"):
        logging.getLogger(name).setLevel(logging.ERROR)
    bar: list[Any] = [None]
    lm = _load_model(cfg, ckpt, progress=lambda k: bar[0].update(k))
    tm = _task_manager(cfg)
    written = 0
    for b, missing in todo.items():
        bar[0] = tqdm(total=len(missing), desc=f"{ckpt.name} {b}", unit="problem", file=sys.stderr)
        for s in range(0, len(missing), cfg.chunk):
            new = _generate(cfg, ckpt, lm, tm, b, missing[s : s + cfg.chunk], problems[b], done)
            written += rec.append(out / SAMPLES, new)
        bar[0].close()
    del lm
    return written


def _task_manager(cfg: RunConfig) -> Any:
    """lm-eval's TaskManager over <out>/tasks, with the run's data sources and --limit."""
    from lm_eval.tasks import TaskManager

    meta: dict[str, Any] = {"rpg_data_files": {b: _source(cfg, b) for b in cfg.benchmarks if _source(cfg, b)}}
    if cfg.limit:
        meta["rpg_limit"] = cfg.limit
    return TaskManager(include_path=str(Path(cfg.out) / "tasks"), include_defaults=False, metadata=meta)


def _load_model(cfg: RunConfig, ckpt: Checkpoint, progress: Callable[[int], None]) -> Any:
    """The lm-eval model of one checkpoint; a failure names the checkpoint (ModelError)."""
    from .lm_models import make_lm

    extra = dict(cfg.model_args)
    if cfg.backend == "hf":
        import torch

        extra.setdefault("device", cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        return make_lm(
            cfg.backend, str(ckpt.path), cfg.n, cfg.seed, cfg.max_tokens, progress=progress, **extra
        )
    except Exception as e:  # noqa: BLE001 - any library error: one line naming the checkpoint
        raise ModelError(
            f"checkpoint {ckpt.name} ({ckpt.path}): the model does not load with --backend {cfg.backend} "
            f"({_one_line(e)}); check its config.json and weight files, or leave it out of --checkpoints"
        ) from e


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text[:300]}"


def _generate(
    cfg: RunConfig,
    ckpt: Checkpoint,
    lm: Any,
    tm: Any,
    benchmark: str,
    idxs: list[int],
    problems: list[Problem],
    done: dict[tuple[str, str, str], set[int]],
) -> list[dict[str, Any]]:
    """One lm-eval call on problems ``idxs`` of ``benchmark``: the records of their missing samples."""
    import lm_eval

    task = task_name(benchmark, cfg.prompt_style)
    try:
        with _no_lm_eval_env_info():
            res = lm_eval.simple_evaluate(
                model=lm,
                tasks=[task],
                task_manager=tm,
                samples={task: idxs},
                log_samples=True,
                # Off for the plain style: its prompt is the problem text verbatim (a model
                # trained on raw "12+7=" strings, or one without a chat template).
                apply_chat_template=uses_chat_template(cfg.prompt_style),
                verbosity="ERROR",
                bootstrap_iters=0,
            )
    except Exception as e:  # noqa: BLE001 - name the checkpoint and benchmark of a generation failure
        raise ModelError(
            f"checkpoint {ckpt.name} ({ckpt.path}), {benchmark}: generation failed ({_one_line(e)}); "
            "the records written so far are kept: fix the cause and run the same command to resume"
        ) from e
    new = []
    for ex in sorted(res["samples"][task], key=lambda e: e["doc_id"]):
        i = int(ex["doc_id"])
        have = done.get((ckpt.name, benchmark, problems[i].id), set())
        if str(ex["doc"]["id"]) != problems[i].id:
            raise RuntimeError(f"lm-eval doc {i} is {ex['doc']['id']!r}, expected {problems[i].id!r}")
        made = build_records(cfg, ckpt, benchmark, ex, i, token_counter(lm))
        new += [r for r in made if r["sample_index"] not in have]
    return new


def check_checkpoints(ckpts: list[Checkpoint], max_tokens: int) -> None:
    """What can be checked of each checkpoint before anything is written: a readable config.json
    (an object), and --max-tokens below its positions (lm-eval asserts otherwise)."""
    for c in ckpts:
        cfg_path = c.path / "config.json"
        try:
            config = json.loads(read_input(cfg_path).decode("utf-8"))
        except InputFileError as e:  # a FIFO or a device there: refused, not waited on
            raise ModelError(f"checkpoint {c.name}: {e}") from None
        except (OSError, ValueError, RecursionError) as e:
            raise ModelError(
                f"checkpoint {c.name}: {cfg_path} is not readable JSON ({type(e).__name__})"
            ) from None
        if not isinstance(config, dict):
            raise ModelError(f"checkpoint {c.name}: {cfg_path} must hold a JSON object")
        positions = config.get("max_position_embeddings")
        if isinstance(positions, int) and not isinstance(positions, bool) and max_tokens >= positions:
            raise ModelError(
                f"checkpoint {c.name}: --max-tokens {max_tokens} does not fit its {positions} positions "
                f"(max_position_embeddings in {cfg_path}); use --max-tokens < {positions} (the prompt's "
                "tokens come on top)"
            )


def run(cfg: RunConfig) -> dict[str, Any]:
    """Evaluate all checkpoints (optionally one Ray task per GPU), then summarize.

    Everything that can be checked is checked before the output directory is touched: options,
    checkpoints, data, and whether ``cfg.out`` is this tool's (outdir.py); the directory is then
    locked for the whole run."""
    cfg.validate()
    skipped: list[Path] = []
    notes: list[str] = []
    ckpts = find_checkpoints(cfg.checkpoints, cfg.final_step, skipped, notes)
    for d in skipped:  # a training run is writing it, or a kill tore it: evaluated once complete
        print(f"[rpg-eval] skipped {d}: {why_incomplete(d)}", file=sys.stderr)
    for line in notes:
        print(f"[rpg-eval] note: {line}", file=sys.stderr)
    inside = checkpoint_holding(Path(cfg.out), ckpts)
    if inside is not None:
        raise outdir.OutputDirError(
            f"--out {cfg.out}: is inside the checkpoint {inside}; rpg-eval writes nothing into a checkpoint "
            "(a file added there is not in its completeness marker): use an --out outside it"
        )
    check_checkpoints(ckpts, cfg.max_tokens)
    if cfg.run is None:
        cfg.run = default_run_name(cfg.checkpoints)
    # Validate the data before anything is written: bad data must leave no partial output directory.
    problems, data = load_problems(cfg)
    out = Path(cfg.out)
    outdir.check_ownership(out)
    out.mkdir(parents=True, exist_ok=True)
    with hold_lock(cfg.out, "rpg-eval"):
        _prepare_out(cfg, out, ckpts, problems, data)
        sampling = dict(n=cfg.n, max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
        write_tasks(
            out / "tasks", cfg.benchmarks, [cfg.prompt_style], allow_fallback=cfg.allow_fallback, **sampling
        )
        written = _evaluate_all(cfg, ckpts, problems)
        result: dict[str, Any] = {"checkpoints": [c.name for c in ckpts], "written": written}
        if cfg.summarize:
            from ..stats.summary import summarize

            result["summary"] = summarize(
                [out / SAMPLES], out, exclude_step0=cfg.exclude_step0, headline=cfg.grader
            )
        return result


def _evaluate_all(cfg: RunConfig, ckpts: list[Checkpoint], problems: dict[str, list[Problem]]) -> int:
    """Records written for every checkpoint: in this process (hf), one process each (vllm: it does
    not give GPU memory back when an engine is deleted), or one Ray task each holding one GPU."""
    cfg_dict = asdict(cfg)
    if cfg.ray:
        import ray

        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"))
        # max_calls=1: a fresh worker per checkpoint, so GPU memory is released in between.
        remote = ray.remote(num_gpus=1, max_calls=1)(evaluate_checkpoint)
        return sum(ray.get([remote.remote(cfg_dict, c, problems) for c in ckpts]))
    if cfg.backend == "vllm":
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        written = 0
        for c in ckpts:
            with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
                written += ex.submit(evaluate_checkpoint, cfg_dict, c, problems).result()
        return written
    return sum(evaluate_checkpoint(cfg_dict, c, problems) for c in ckpts)


def default_run_name(spec: str) -> str:
    """The last directory of the checkpoints spec before any glob character."""
    parts = []
    for part in Path(spec).parts:
        if any(ch in part for ch in "*?["):
            break
        parts.append(part)
    return Path(*parts).resolve().name if parts else "run"
