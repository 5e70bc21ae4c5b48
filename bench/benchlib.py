"""Shared helpers of the benchmark scripts: side-by-side timing, CPU peak memory, reporting.

Timing rule: every figure a script prints as a *ratio* is measured side by side in one run:
the candidates are timed in interleaved rounds (round r runs every candidate once, in a
rotated order), and each candidate's time is the median over the rounds. Background load
on a shared machine then slows all candidates alike and cancels in the ratio.

Peak memory on CPU (``peak_cpu_bytes``): torch CPU tensors do not pass through Python's
allocator (tracemalloc does not see them), and RSS depends on glibc's malloc (mmap
threshold, arenas, trimming). We read the allocator itself instead: with
``torch.profiler.profile(profile_memory=True)`` c10's ``ProfiledCPUMemoryReporter`` reports
every CPU tensor allocation and free (pointer, bytes) made while profiling. The prefix sum
of those signed byte counts, in event order, is the number of tensor bytes allocated in the
measured region and still alive; its maximum is the region's peak tensor memory (forward
temporaries, tensors saved for backward, gradients). Frees of tensors allocated before the
region are not reported, so inputs created beforehand count zero, as they should.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/x.py` from a checkout without install
    sys.path.insert(0, str(REPO))


def interleaved_times(
    fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Seconds per call of every fn, measured in `repeats` interleaved rounds (rotated order)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def median(xs: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    return float(statistics.median(xs))


def paired_ratio(times: dict[str, list[float]], name: str, base: str) -> float:
    """Median over rounds of time[name] / time[base] (both measured in the same round)."""
    return median([a / b for a, b in zip(times[name], times[base])])


# Lines torch's profiler (kineto) writes straight to fd 2 on every start/stop, e.g.
# "USDT:2026-01-01 10:00:00 123:123 SyncActivityProfilerHandler.cpp:52] profiler_start".
_KINETO_LOG = re.compile(rb"^(USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\] ")


@contextlib.contextmanager
def _without_kineto_log() -> Iterator[None]:
    """Keep kineto's log lines out of the benchmark output; everything else written to stderr
    in the block (warnings, errors) is passed on when it ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as buf:
        os.dup2(buf.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            buf.seek(0)
            kept = [line for line in buf.read().splitlines(keepends=True) if not _KINETO_LOG.match(line)]
            if kept:
                sys.stderr.buffer.write(b"".join(kept))
                sys.stderr.flush()


def peak_cpu_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes of CPU tensor memory allocated (and still alive) while fn() runs.

    Reads c10's CPU allocator through the profiler (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    with _without_kineto_log(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())  # stable: same-ns events keep their recorded order
    live = peak = 0
    for e in events:
        if e.device_type().name != "CPU":
            continue
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def environment(with_torch: bool = True) -> dict[str, Any]:
    """What a reader needs to judge a figure: machine, load, library versions."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if with_torch:  # the grader benchmark does not import torch
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info


#: Paths in a result are written relative to the repository, so a committed result reads the same in any
#: clone (../shared/data for the benchmark files); a path elsewhere keeps only its name.
REPO = Path(__file__).resolve().parents[1]


def portable(value: Any) -> Any:
    """``value`` with every absolute path string made relative to the repository (or cut to its name)."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable(v) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str) and os.path.isabs(value):
        path = Path(os.path.abspath(value))
        return os.path.relpath(path, REPO) if path.is_relative_to(REPO.parent) else path.name
    return value


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    """Write the results as JSON when --json PATH was given (paths in them made portable)."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(portable(payload), indent=2, default=str) + "\n")
        print(f"wrote {path}")


def fmt_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain fixed-width text table."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v)

    widths = {c: max(len(c), *(len(cell(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(cell(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)
