"""``rpg-eval score``: sample logs re-graded offline with both graders (lm-eval's logged samples,
rpg-eval's records, or plain ``{response, gold}`` lines), with counts, pass@k and where the graders
disagree; optionally written as scored records (never over an input or into a run directory).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import check_output_path, write_file
from rpg_openrlhf.common.cliutil import load_json
from rpg_openrlhf.common.inputs import open_input

from .metrics import pass_at_ks
from .summary import GRADER_NAMES, disagreements


def _items_from_line(obj: dict[str, Any], where: str) -> list[tuple[str, int, str, str]]:
    """(problem_id, sample_index, gold, response) of one input line: an lm-eval logged
    sample, one of our records, or a plain {response|responses, gold|answer} object."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "filtered_resps" in obj or "resps" in obj:
        doc = obj.get("doc") or {}
        fr = obj.get("filtered_resps") or obj.get("resps")
        doc = doc if isinstance(doc, dict) else {}
        if not isinstance(fr, list):
            raise ValueError(f"{where}: 'filtered_resps'/'resps' must be a list")
        resps = fr[0] if fr and isinstance(fr[0], list) else fr
        if resps and isinstance(resps[0], list):  # raw resps: [[r1], [r2], ...]
            resps = [x[0] for x in resps]
        gold = doc.get("answer", obj.get("target"))
        pid = str(doc.get("id", obj.get("doc_id")))
        return [(pid, j, str(gold), str(t)) for j, t in enumerate(resps)]
    gold = obj.get("gold", obj.get("answer"))
    if gold is None:
        raise ValueError(f"{where}: no gold answer (fields gold/answer/target)")
    pid = str(obj.get("problem_id", obj.get("id", where)))
    if "responses" in obj:
        if not isinstance(obj["responses"], list):
            raise ValueError(f"{where}: 'responses' must be a list of strings")
        return [(pid, j, str(gold), str(t)) for j, t in enumerate(obj["responses"])]
    if "response" in obj:
        j = obj.get("sample_index", 0)
        if isinstance(j, bool) or not isinstance(j, int):
            raise ValueError(f"{where}: 'sample_index' must be an integer, got {j!r}")
        return [(pid, j, str(gold), str(obj["response"]))]
    raise ValueError(f"{where}: no response (fields response/responses/filtered_resps)")


def check_score_out(out: str | Path, inputs: Iterable[str | Path]) -> None:
    """Refuse a ``score --out`` that would destroy what it reads or a run's records: an input
    file itself, a path inside a directory ``rpg-eval run`` wrote, or something that is not a
    regular file (a directory, a device, a FIFO)."""
    check_output_path(out, "--out")  # absent or a regular file: not a link, a FIFO, a device, a directory
    target = Path(out)
    for p in inputs:
        if target.exists() and Path(p).exists() and target.samefile(p):
            raise ValueError(
                f"--out {out}: is an input of this command; write the scored records to another file"
            )
    from ..outdir import run_dir_of

    run = run_dir_of(target.resolve().parent)
    if run is not None:
        raise ValueError(
            f"--out {out}: is inside the run directory {run} (it holds rpg-eval's run.json); write the "
            "scored records outside it, where they cannot be taken for the run's own"
        )


def _score_items(paths: Iterable[str | Path]) -> list[tuple[str, int, str, str]]:
    """(problem_id, sample_index, gold, response) of every line of the inputs."""
    items: list[tuple[str, int, str, str]] = []
    for p in paths:
        with open_input(p) as f:  # a link to /dev/zero or a FIFO is refused, not read forever
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    where = f"{p}:{lineno}"
                    items += _items_from_line(load_json(line, where), where)
    if not items:
        raise ValueError("no samples to score")
    return items


def score(
    paths: Iterable[str | Path],
    out: str | Path | None = None,
    allow_fallback: bool = False,
    timeout: float = 5,
) -> dict[str, Any]:
    """Re-score sample logs offline with both graders; optionally write scored records."""
    from ..graders import check_timeout, grade_many

    paths = list(paths)
    try:
        check_timeout(timeout)
    except ValueError as e:
        raise ValueError(f"--timeout: {e}") from None
    if out is not None:
        check_score_out(out, paths)
    items = _score_items(paths)
    responses, golds = [i[3] for i in items], [i[2] for i in items]
    mv = grade_many(
        responses, golds, "math_verify", timeout=timeout, allow_fallback=allow_fallback, progress=True
    )
    pa = grade_many(responses, golds, "paper")
    scored = [
        {
            "problem_id": pid,
            "sample_index": j,
            "gold": gold,
            "response": resp,
            "extracted": {"math_verify": a.extracted, "paper": b.extracted},
            "correct": {"math_verify": a.correct, "paper": b.correct},
            "error_math_verify": a.error,
        }
        for (pid, j, gold, resp), a, b in zip(items, mv, pa)
    ]
    if out:
        write_file(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in scored), "--out")
    return _score_result(scored)


def _score_result(scored: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts, mean of each grader, pass@k (equal sample counts) and disagreements."""
    by_problem: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in scored:
        by_problem[r["problem_id"]].append(r)
    result: dict[str, Any] = {"n_problems": len(by_problem), "n_samples": len(scored)}
    for g in GRADER_NAMES:
        per = [sum(r["correct"][g] for r in rs) / len(rs) for rs in by_problem.values()]
        result[f"mean_{g}"] = sum(per) / len(per)
    if len({len(rs) for rs in by_problem.values()}) == 1:
        result.update(pass_at_ks([[r["correct"]["math_verify"] for r in rs] for rs in by_problem.values()]))
    result["disagreements"] = disagreements(scored)
    return result
