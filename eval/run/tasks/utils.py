"""lm-eval hooks for the rpg_* tasks (referenced from the yamls as ``!function utils.X``).

Data source of a task, first match wins:
  1. task metadata ``rpg_data_files: {benchmark: path}`` or ``rpg_data_dir: DIR``
     (``TaskManager(metadata=...)`` or ``lm_eval --metadata '{"rpg_data_dir": "..."}'``);
  2. env ``RPG_EVAL_<BENCHMARK>_PATH`` (a file), then env ``RPG_EVAL_DATA_DIR`` (a directory);
  3. the hub default of rpg_eval.data.HUB_DEFAULTS.
``rpg_limit`` (metadata) keeps the first N problems.
"""

from __future__ import annotations

import json
import os
from typing import Any

from rpg_eval.data import load_benchmark, select
from rpg_eval.graders import grade_many
from rpg_eval.run.prompts import render_prompt
from rpg_eval.stats.metrics import ks_for, pass_at_k


def resolve_source(benchmark: str, meta: dict[str, Any]) -> str | None:
    """Where ``benchmark``'s data comes from (see module docstring); None = hub default."""
    files = meta.get("rpg_data_files") or {}
    if isinstance(files, str):
        files = json.loads(files)
    if files.get(benchmark):
        return str(files[benchmark])
    if meta.get("rpg_data_dir"):
        return str(meta["rpg_data_dir"])
    env_file = os.environ.get(f"RPG_EVAL_{benchmark.upper()}_PATH")
    if env_file:
        return env_file
    return os.environ.get("RPG_EVAL_DATA_DIR") or None


def load_dataset(**kwargs: Any):
    """custom_dataset hook: lm-eval passes task metadata + dataset_kwargs (benchmark, prompt_style,
    allow_fallback).  ``allow_fallback`` is copied into every row because process_results sees only
    the doc, not the task's kwargs."""
    import datasets

    benchmark = kwargs["benchmark"]
    style = kwargs.get("prompt_style", "boxed")
    allow_fallback = bool(kwargs.get("allow_fallback", False))
    problems = load_benchmark(resolve_source(benchmark, kwargs), benchmark)
    limit = kwargs.get("rpg_limit")
    problems = select(problems, limit=int(limit) if limit else None)
    rows = [
        {
            "id": p.id,
            "problem": p.problem,
            "answer": p.answer,
            "benchmark": benchmark,
            "prompt_style": style,
            "prompt": render_prompt(p.problem, style),
            # Only when on: the built-in tasks' docs stay exactly as they were.
            **({"allow_fallback": True} if allow_fallback else {}),
        }
        for p in problems
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def grade_responses(responses: list[str], gold: str, allow_fallback: bool = False) -> dict[str, list]:
    """Both graders' verdicts and extracted answers for the samples of one problem.

    ``allow_fallback``: math-verify's anchor-free fallback (a bare "19" is read as 19); the paper
    grader has no such mode and says wrong for an answer without a ``\\boxed{}``/``Answer:`` anchor."""
    mv = grade_many(
        responses, [gold] * len(responses), "math_verify", processes=0, allow_fallback=allow_fallback
    )
    pa = grade_many(responses, [gold] * len(responses), "paper")
    return {
        "math_verify": [v.correct for v in mv],
        "paper": [v.correct for v in pa],
        "extracted_math_verify": [v.extracted for v in mv],
        "extracted_paper": [v.extracted for v in pa],
        "error_math_verify": [v.error for v in mv],
    }


def process_results(doc: dict, results: list) -> dict[str, Any]:
    """All k samples of one problem (take_first_k filter) -> mean@k, pass@k, verdicts.

    ``verdicts`` (a json string, logged per sample) keeps both graders' verdicts and
    extracted answers; its aggregate is the overall math-verify accuracy.
    """
    responses = results[0] if results and isinstance(results[0], list) else results
    responses = [r if isinstance(r, str) else str(r) for r in responses]
    v = grade_responses(responses, str(doc["answer"]), bool(doc.get("allow_fallback", False)))
    n = len(responses)
    c_mv, c_pa = sum(v["math_verify"]), sum(v["paper"])
    out: dict[str, Any] = {"mean_at_k": c_mv / n, "paper_mean_at_k": c_pa / n}
    for k in ks_for(n):
        out[f"pass_at_{k}"] = pass_at_k(n, c_mv, k)
    out["verdicts"] = json.dumps(v)
    return out


def agg_verdicts(items: list[str]) -> float:
    """Aggregate of the per-problem ``verdicts`` strings: accuracy over all samples."""
    flat = [c for s in items for c in json.loads(s)["math_verify"]]
    return sum(flat) / len(flat) if flat else float("nan")
