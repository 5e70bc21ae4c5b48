"""What a finished check run measured, read back from its directory (``pipeline.run``'s outputs): the
engine-vs-actor gap by token position, both sleeps, the dynamic micro-batches and their accumulation
boundaries, the step time and the peak memory: one line per check, ``PASS  name  what was measured``;
the lines also go to ``report.json``."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import write_file


@dataclass
class Check:
    """The outcome of one check and what it measured."""

    name: str
    ok: bool
    detail: str
    values: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name:<16} {self.detail}"


def write(checks: list[Check], out: Path) -> None:
    """``report.json`` in ``out`` (the lines and their values), written atomically."""
    write_file(out / "report.json", json.dumps([asdict(c) for c in checks], indent=2, sort_keys=True) + "\n")


#: bf16 engine vs bf16 actor forward, |log-prob difference|: the mean in every position bucket, and the
#: largest single one. Not measured on a GPU yet (none was available): first-run values set them.
BF16_MEAN_TOL = 2e-2
BF16_MAX_TOL = 0.25
#: Upper ends of the token-position buckets of the gap (positions past the last go in the last).
BUCKETS = (64, 512, 2048, 8192, 32768)


def _buckets(n: int) -> list[tuple[int, int]]:
    """[(first, last)] position ranges, 1-based, covering 1..n."""
    edges = [b for b in BUCKETS if b < n] + [n]
    return list(zip([1, *[e + 1 for e in edges[:-1]]], edges))


def _gap_rows(records: list[dict]) -> list:
    """|engine - actor| per position of every sequence, every engine, every sync (float64 tensors)."""
    return [
        (engine.double() - actor.double()).abs()
        for r in records for rows in r["engines"] for engine, actor in zip(rows, r["actor"])
    ]  # fmt: skip


def engine_vs_actor(records: list[dict]) -> Check:
    """The gap by position (over the longest sequence's positions and all others) and the actor's moves."""
    import torch

    if not records:
        return Check("engine-vs-actor", False, "no sync record (did a weight sync run?)")
    gaps = _gap_rows(records)
    longest = max(len(g) for g in gaps)
    parts, values, ok = [], {"buckets": []}, True
    for first, last in _buckets(longest):
        cells = torch.cat([g[first - 1 : last] for g in gaps if len(g) >= first])
        mean, worst = float(cells.mean()), float(cells.max())
        ok &= mean <= BF16_MEAN_TOL and worst <= BF16_MAX_TOL
        values["buckets"].append({"first": first, "last": last, "mean": mean, "max": worst})
        parts.append(f"{first}-{last}: mean {mean:.2g} max {worst:.2g}")
    moved = [
        float(torch.cat([(a.double() - b.double()).abs() for a, b in zip(r["actor"], p["actor"])]).mean())
        for p, r in zip(records, records[1:])
    ]
    largest_mean = max(b["mean"] for b in values["buckets"])
    if moved:  # a stale engine would be off by about this much: it must dwarf the gap
        ok &= min(moved) > 2 * largest_mean
    values.update(moved=moved, syncs=len(records), forward=records[0].get("forward"))
    detail = (
        f"|log-prob| gap by position {'; '.join(parts)} over {len(records)} syncs "
        f"({records[0].get('forward', '?')}); actor moved {', '.join(f'{m:.2g}' for m in moved) or '-'} "
        f"between syncs (tolerance mean {BF16_MEAN_TOL}, max {BF16_MAX_TOL}; unmeasured)"
    )
    return Check("engine-vs-actor", ok, detail, values)


def _events(dump: Path) -> dict[int, list[dict]]:
    return {
        int(p.stem.removeprefix("events_rank")): [
            _json(line, f"{p}:{i}", dict) for i, line in enumerate(p.read_text().splitlines(), 1)
        ]
        for p in sorted(dump.glob("events_rank*.jsonl"))
    }


def deepspeed_sleep(dump: Path) -> Check:
    """Every training micro-batch follows a reload of the actor's states, and each rank ends offloaded."""
    ranks = _events(dump)
    problems = []
    for rank, events in ranks.items():
        state, trains = None, 0
        for e in events[1:]:
            if e["event"] in ("offload", "reload"):
                state = e["event"]
            elif e["event"] == "train":
                trains += 1
                problems += (
                    []
                    if state == "reload"
                    else [f"rank {rank}: a micro-batch ran {state or 'before any reload'}"]
                )
        if events and events[-1]["event"] != "offload":
            problems.append(f"rank {rank}: not offloaded at the end")
    ok = bool(ranks) and not problems
    detail = f"{len(ranks)} actor rank(s): states reloaded for every micro-batch, offloaded after each step"
    return Check("deepspeed-sleep", ok, "; ".join(problems[:3]) or detail if ranks else "no step-dump events")


def micro_batches(dump: Path) -> Check:
    """The 8K path's dynamic batching: on every rank every optimizer step ran 2+ packed micro-batches, and
    DeepSpeed took only the last one as an accumulation boundary (the grad-boundary fix; without it
    every micro-batch is one and the optimizer sees the last micro-batch's gradient alone)."""
    ranks = _events(dump)
    problems, counts = [], []
    for rank, events in ranks.items():
        steps: dict[int, list[bool]] = {}
        for e in events:
            if e["event"] == "boundary":
                steps.setdefault(e["optimizer_step"], []).append(e["boundary"])
        for step, flags in sorted(steps.items()):
            counts.append(len(flags))
            if len(flags) < 2:
                problems.append(f"rank {rank} step {step}: {len(flags)} micro-batch (no dynamic split)")
            elif flags != [False] * (len(flags) - 1) + [True]:
                problems.append(f"rank {rank} step {step}: boundaries {flags} (the earlier micro-batches' "
                                "gradients are dropped: grad-boundary fix not applied)")  # fmt: skip
    ok = bool(counts) and not problems
    detail = (f"{len(ranks)} rank(s): {min(counts, default=0)}-{max(counts, default=0)} packed micro-batches "
              "per optimizer step, only the last an accumulation boundary")  # fmt: skip
    return Check("micro-batches", ok, "; ".join(problems[:3]) or detail if counts else "no boundary events",
                 {"per_step": counts})  # fmt: skip


def vllm_sleep(log: str) -> Check:
    """vLLM's own "Sleep mode freed X GiB" lines (one per engine each time it sleeps)."""
    freed = [float(x) for x in re.findall(r"Sleep mode freed ([\d.]+) GiB", log)]
    detail = (
        f"{len(freed)} sleeps, freed {min(freed):.2f}-{max(freed):.2f} GiB"
        if freed
        else "no vLLM sleep logged"
    )
    return Check("vllm-sleep", bool(freed), detail, {"freed_gib": freed})


def step_time(dump: Path, run: dict) -> Check:
    """Seconds from one RL step's first training micro-batch to the next one's (rank 0), and the wall time."""
    firsts: dict[int, float] = {}
    for e in _events(dump).get(0, []):
        if e["event"] == "train":
            firsts.setdefault(e["optimizer_step"], e["time"])
    steps = [firsts[s] for s in sorted(firsts)]
    between = [b - a for a, b in zip(steps, steps[1:])]
    detail = (f"RL step {', '.join(f'{t:.1f}' for t in between) or '-'} s; run {run.get('wall_s', 0):.0f} s for "
              f"{run.get('steps', '?')} steps with start-up")  # fmt: skip
    return Check("step-time", bool(between), detail, {"step_s": between, "wall_s": run.get("wall_s")})


def peak_memory(memory: dict) -> Check:
    """The largest NVML 'used' of every GPU while the run lasted, against its total."""
    peak, total = memory.get("peak_mib", {}), memory.get("total_mib", {})
    cells = [f"GPU {i}: {peak[i] / 1024:.1f} / {total[i] / 1024:.1f} GiB" for i in sorted(peak)]
    ok = bool(cells) and all(peak[i] < total[i] for i in peak)
    return Check("peak-memory", ok, "; ".join(cells) or "not sampled", {"peak_mib": peak, "total_mib": total})


def pipeline(run: dict, log: str) -> Check:
    """rpg-train exited 0 after the steps asked for."""
    steps = sorted({int(s) for s in re.findall(r"Global step (\d+):", log)})
    ok = run.get("returncode") == 0 and len(steps) == run.get("steps")
    detail = f"rpg-train --backend gpu exit {run.get('returncode')}, global steps {steps}"
    return Check("pipeline", ok, detail if ok else f"{detail}; see log.txt", {"steps": steps})


def _json(text: str, where: str, kind: type) -> Any:
    """One JSON value of type ``kind`` or ValueError naming ``where``."""
    from rpg_openrlhf.common.cliutil import load_json

    value = load_json(text, where)
    if not isinstance(value, kind):
        raise ValueError(f"{where}: expected a JSON {kind.__name__}, got {type(value).__name__}")
    return value


def load_sync_record(path: Path) -> dict:
    """One ``sync_NNNNN.pt``: tensors, lists, numbers and strings only (``weights_only=True``: a
    planted pickle's ``__reduce__`` is refused, never run), or ValueError naming the file. Only a
    regular file is opened (a FIFO at the name would block the read forever)."""
    import pickle

    import torch

    from rpg_openrlhf.common.inputs import open_input

    try:
        with open_input(path) as f:
            record = torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's message advises weights_only=False: the one thing not to do
        raise ValueError(
            f"{path}: not a sync record this check can read safely (it holds pickled objects beyond "
            "tensors and plain data, which are never loaded); it was not written by the node check"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: not a sync record this check can read safely ({first})") from None
    if not isinstance(record, dict) or not {"actor", "engines"} <= record.keys():
        raise ValueError(f"{path}: not a sync record (a dict with 'actor' and 'engines')")
    return record


def _text(path: Path) -> str:
    """A regular file's text (a FIFO or device at the name is refused, never read)."""
    from rpg_openrlhf.common.inputs import open_input

    with open_input(path) as f:
        return f.read().decode("utf-8", errors="replace")


def analyse(out: Path) -> list[Check]:
    """Every run-derived check of the directory ``out``; ValueError naming the file that is missing or
    malformed (a run that never finished writes no ``run.json``)."""
    for name in ("run.json", "log.txt"):
        if not (out / name).exists():
            raise ValueError(f"{out}: no {name} (not a finished node check's directory)")
    run = _json(_text(out / "run.json"), str(out / "run.json"), dict)
    log = _text(out / "log.txt")
    records = [load_sync_record(p) for p in sorted((out / "sync").glob("sync_*.pt"))]
    path = out / "memory.json"
    memory = _json(_text(path), str(path), dict) if path.exists() else {}
    try:
        memory = {k: {int(i): float(v) for i, v in d.items()} for k, d in memory.items()}
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f'{path}: expected {{"peak_mib": {{"GPU": MiB}}, ...}}') from None
    return [pipeline(run, log), engine_vs_actor(records), deepspeed_sleep(out / "dump"),
            micro_batches(out / "dump"), vllm_sleep(log), step_time(out / "dump", run),
            peak_memory(memory)]  # fmt: skip
