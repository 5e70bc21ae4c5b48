"""Tidy tables from sample records (a pure function of the records), and offline re-scoring.

summary.csv: one row per (run, checkpoint, step, benchmark, grader): mean@k with a 95%
bootstrap interval over problems (seeded), pass@k for k in {1, 2, 4, ..., n}.
last_best.csv: one row per (run, benchmark, grader): Last = highest step, Best = max mean
over checkpoints (earliest step on ties; ``exclude_step0`` leaves step 0 out of Best).
Schemas: docs/contracts.md.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import atomic_write

from . import records as rec
from .metrics import ks_for, summarize_counts

GRADER_NAMES = ("math_verify", "paper")
SUMMARY_HEAD = [
    "run",
    "checkpoint",
    "step",
    "benchmark",
    "grader",
    "prompt_style",
    "n_problems",
    "n_samples",
    "mean",
    "ci_low",
    "ci_high",
]
LAST_BEST_HEAD = [
    "run",
    "benchmark",
    "grader",
    "last",
    "last_step",
    "last_ci_low",
    "last_ci_high",
    "best",
    "best_step",
    "best_ci_low",
    "best_ci_high",
]


def load_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """All records of the given samples.jsonl files (or run directories), each (run, checkpoint,
    benchmark, problem, sample) once: a key seen again (two runs that wrote one directory at
    once, or a file given twice) is counted once, with a warning."""
    out: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    dupes = 0
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "samples.jsonl"
        for r in rec.read_records(p):
            key = record_key(r)
            if key in seen:
                dupes += 1
                continue
            seen.add(key)
            out.append(r)
    if dupes:
        print(f"[rpg-eval] {dupes} duplicate records (same run, checkpoint, benchmark, problem, sample) counted once",
              file=sys.stderr)  # fmt: skip
    return out


def record_key(r: dict[str, Any]) -> tuple[str, str, str, str, int]:
    """What identifies a sample record: (run, checkpoint, benchmark, problem_id, sample_index)."""
    return (r["run"], r["checkpoint"], r["benchmark"], str(r["problem_id"]), int(r["sample_index"]))


def summary_rows(
    records: list[dict[str, Any]], seed: int = 0, iters: int = 2000, warn: bool = True
) -> list[dict[str, Any]]:
    """summary.csv rows.  Problems with fewer samples than the unit's maximum (an
    interrupted unit) are left out, with a warning."""
    units: dict[tuple, dict[str, dict[int, dict[str, bool]]]] = defaultdict(lambda: defaultdict(dict))
    styles: dict[tuple, set] = defaultdict(set)
    for r in records:
        key = (r["run"], r["checkpoint"], int(r["step"]), r["benchmark"])
        units[key][r["problem_id"]][int(r["sample_index"])] = r["correct"]
        styles[(r["run"], r["benchmark"])].add(r["prompt_style"])
    for (run, bench), st in styles.items():
        if len(st) > 1:
            raise ValueError(
                f"run {run!r} mixes prompt styles {sorted(st)} on {bench}: use one --run per style"
            )
    rows = []
    for key in sorted(units, key=lambda k: (k[0], k[3], k[2], k[1])):
        run, ckpt, step, bench = key
        probs = units[key]
        n = max(len(s) for s in probs.values())
        full = {pid: s for pid, s in probs.items() if len(s) == n}
        if warn and len(full) < len(probs):
            print(
                f"[rpg-eval] {ckpt} {bench}: {len(probs) - len(full)} incomplete problems left out",
                file=sys.stderr,
            )
        style = next(iter(styles[(run, bench)]))
        for g in GRADER_NAMES:
            correct = [[s[j][g] for j in sorted(s)] for _, s in sorted(full.items())]
            m = summarize_counts(correct, seed=seed, iters=iters)
            row = {
                "run": run,
                "checkpoint": ckpt,
                "step": step,
                "benchmark": bench,
                "grader": g,
                "prompt_style": style,
                "n_problems": len(full),
                "n_samples": n,
            }
            row.update(m)
            rows.append(row)
    return rows


def last_best_rows(rows: list[dict[str, Any]], exclude_step0: bool = False) -> list[dict[str, Any]]:
    """last_best.csv rows from summary rows."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["run"], r["benchmark"], r["grader"])].append(r)
    out = []
    for (run, bench, g), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: (r["step"], r["checkpoint"]))
        last = rs[-1]
        pool = [r for r in rs if not (exclude_step0 and r["step"] == 0)] or rs
        best = pool[0]
        for r in pool[1:]:
            if r["mean"] > best["mean"]:
                best = r
        out.append(
            {
                "run": run,
                "benchmark": bench,
                "grader": g,
                "last": last["mean"],
                "last_step": last["step"],
                "last_ci_low": last["ci_low"],
                "last_ci_high": last["ci_high"],
                "best": best["mean"],
                "best_step": best["step"],
                "best_ci_low": best["ci_low"],
                "best_ci_high": best["ci_high"],
            }
        )
    return out


def disagreements(records: list[dict[str, Any]], max_examples: int = 5) -> dict[str, Any]:
    """Where the two graders disagree: counts and a few examples (shortened)."""
    mv_only = [r for r in records if r["correct"]["math_verify"] and not r["correct"]["paper"]]
    pa_only = [r for r in records if r["correct"]["paper"] and not r["correct"]["math_verify"]]

    def ex(r: dict[str, Any]) -> dict[str, Any]:
        return {
            "checkpoint": r.get("checkpoint"),
            "benchmark": r.get("benchmark"),
            "problem_id": r.get("problem_id"),
            "sample_index": r.get("sample_index"),
            "gold": r.get("gold"),
            "extracted": r.get("extracted"),
            "response_tail": str(r.get("response", ""))[-200:],
        }

    return {
        "n_samples": len(records),
        "n_disagree": len(mv_only) + len(pa_only),
        "math_verify_only": len(mv_only),
        "paper_only": len(pa_only),
        "examples_math_verify_only": [ex(r) for r in mv_only[:max_examples]],
        "examples_paper_only": [ex(r) for r in pa_only[:max_examples]],
    }


def _write_csv(path: Path, head: list[str], rows: list[dict[str, Any]]) -> None:
    """Write a csv atomically (tmp + rename): readers never see half a table."""
    extra = sorted({k for r in rows for k in r} - set(head), key=_col_order)
    with atomic_write(path, newline="") as f:
        w = csv.DictWriter(f, fieldnames=head + extra, restval="")
        w.writeheader()
        w.writerows(rows)


def _write_text(path: Path, text: str) -> None:
    """Write a file atomically (tmp + rename)."""
    with atomic_write(path) as f:
        f.write(text)


def _col_order(c: str) -> tuple[int, str]:
    return (int(c.split("@")[1]), c) if c.startswith("pass@") else (10**9, c)


def summarize(
    paths: Iterable[str | Path],
    out: str | Path,
    exclude_step0: bool = False,
    seed: int = 0,
    iters: int = 2000,
    headline: str = "math_verify",
) -> dict[str, Any]:
    """Write summary.csv, last_best.csv and disagreements.json into ``out``; print the headline."""
    records = load_records(paths)
    if not records:
        raise ValueError("no records to summarize")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = summary_rows(records, seed=seed, iters=iters)
    lb = last_best_rows(rows, exclude_step0=exclude_step0)
    _write_csv(out / "summary.csv", SUMMARY_HEAD, rows)
    _write_csv(out / "last_best.csv", LAST_BEST_HEAD, lb)
    dis = disagreements(records)
    _write_text(out / "disagreements.json", json.dumps(dis, indent=1, ensure_ascii=False))
    for r in lb:
        if r["grader"] == headline:
            print(
                f"{r['run']} {r['benchmark']} [{headline}] last={100 * r['last']:.1f} (step {r['last_step']}) "
                f"best={100 * r['best']:.1f} (step {r['best_step']})"
            )
    print(f"graders disagree on {dis['n_disagree']} of {dis['n_samples']} samples (see disagreements.json)")
    return {"summary": rows, "last_best": lb, "disagreements": dis}


# --------------------------------------------------------------------------- score


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


def score(
    paths: Iterable[str | Path],
    out: str | Path | None = None,
    allow_fallback: bool = False,
    timeout: float = 5,
) -> dict[str, Any]:
    """Re-score sample logs offline with both graders; optionally write scored records."""
    from .graders import grade_many

    if not timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {timeout!r}")
    if out is not None and Path(out).is_dir():
        raise ValueError(f"--out {out}: is a directory; give the file to write the scored records to")

    items: list[tuple[str, int, str, str]] = []
    for p in paths:
        with Path(p).open("rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
                    msg = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
                    raise ValueError(f"{p}:{lineno}: invalid JSON ({msg})") from None
                items += _items_from_line(obj, f"{p}:{lineno}")
    if not items:
        raise ValueError("no samples to score")
    responses = [i[3] for i in items]
    golds = [i[2] for i in items]
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
        _write_text(Path(out), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in scored))
    by_problem: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in scored:
        by_problem[r["problem_id"]].append(r)
    result: dict[str, Any] = {"n_problems": len(by_problem), "n_samples": len(scored)}
    for g in GRADER_NAMES:
        per = [sum(r["correct"][g] for r in rs) / len(rs) for rs in by_problem.values()]
        result[f"mean_{g}"] = sum(per) / len(per)
    ns = {len(rs) for rs in by_problem.values()}
    if len(ns) == 1:
        n = ns.pop()
        m = summarize_counts([[r["correct"]["math_verify"] for r in rs] for rs in by_problem.values()])
        result.update({k: v for k, v in m.items() if k.startswith("pass@") and int(k[5:]) in ks_for(n)})
    result["disagreements"] = disagreements(scored)
    return result
