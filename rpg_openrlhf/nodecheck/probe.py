"""``python -m rpg_openrlhf.nodecheck.probe [--device cuda|cpu] [--out FILE] [--stages A,B]``: what one
borrowed GPU can tell about the plan, with only torch, transformers, triton, OpenRLHF 0.11.2 (no deps),
DeepSpeed (a pure wheel) and small dependencies installed (``scripts/gpu_probe_kit.sh`` builds that kit;
no vLLM, Ray or flash-attn needed). One line per stage, and ``--out`` (JSON) rewritten atomically after
each stage, so a run cut short keeps what finished:

Stages (:mod:`.probe_stages`): ``environment`` (versions, the GPU's usable memory, driver, nvcc),
``losses`` (every registered loss and style, both references, with and without the rollout correction,
bf16 and fp32 against fp64; their time and memory: ``bench/loss_cost.py --device cuda``), ``policy``
(OpenRLHF's ``Actor`` around a random Qwen3-4B: peak memory at the 8K plan's token counts against the
plan's terms, tokens/s, the chunked path) and ``zero2`` (DeepSpeed ZeRO-2 on one rank: FusedAdam's build, optimizer
states vs 12P, what the sleep offload leaves).

``--device cpu`` runs every stage at tiny shapes (CI). Exit 0 when every stage passed, 1 otherwise, 2 on
bad arguments or an ``--out`` that cannot be written (checked before any stage runs). A stage that raises
is recorded as failed and the next runs; a stage with a failed measurement (an ``error`` anywhere in its
record) fails, whatever it concluded itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import check_output_path, write_file
from rpg_openrlhf.common.cliutil import OneLineParser, quiet_known_warnings

PROG = "python -m rpg_openrlhf.nodecheck.probe"


def parser() -> argparse.ArgumentParser:
    from rpg_openrlhf.nodecheck.probe_stages import STAGES

    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda: full shapes; cpu: tiny")
    p.add_argument(
        "--out", type=Path, default=Path("runs/gpu-probe.json"), help="JSON, rewritten after each stage"
    )
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    return p


def failed_measurements(result: Any, where: str = "") -> list[str]:
    """Where in a stage's record a measurement failed (an ``error`` key at any depth)."""
    if isinstance(result, dict):
        found = [where or "stage"] if "error" in result else []
        return found + [
            f for k, v in result.items() for f in failed_measurements(v, f"{where}.{k}" if where else str(k))
        ]
    if isinstance(result, list):
        return [f for i, v in enumerate(result) for f in failed_measurements(v, f"{where}[{i}]")]
    return []


def run(device: str, stages: list[str], out: Path) -> dict[str, Any]:
    """Every stage in order; the record is written after each."""
    import torch

    from rpg_openrlhf.nodecheck.probe_stages import STAGES

    size = "full" if device == "cuda" else "tiny"
    record: dict[str, Any] = {"device": device, "size": size, "started": time.time(), "stages": {}}
    torch.manual_seed(0)
    for name in stages:
        start = time.perf_counter()
        try:
            result = STAGES[name](device, size)
        except Exception as exc:  # noqa: BLE001 (recorded; the next stage still runs)
            result = {"ok": False, "summary": f"{type(exc).__name__}: {str(exc)[:300]}",
                      "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        result["seconds"] = time.perf_counter() - start
        failed = failed_measurements(result)
        if failed and result["ok"]:  # the stage's own verdict left a failed measurement out
            result["ok"] = False
            result["summary"] = f"failed measurement(s) {', '.join(failed[:3])}; {result['summary']}"
        record["stages"][name] = result
        write_file(out, json.dumps(record, indent=1, default=str) + "\n")
        status = "PASS" if result["ok"] else "FAIL"
        print(f"{status}  {name:<12} {result['seconds']:6.1f} s  {result['summary']}", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    return record


def main(argv: Sequence[str] | None = None) -> None:
    quiet_known_warnings()  # torch's pynvml warning and bitsandbytes' kernel line precede every error otherwise
    from rpg_openrlhf.nodecheck.probe_stages import STAGES

    p = parser()
    args = p.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        p.error(f"--stages: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(STAGES)}")
    try:  # before any stage runs: a stage's result is never lost to an unwritable --out
        check_output_path(args.out, "--out")
    except ValueError as exc:
        p.error(str(exc))
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            from rpg_openrlhf.launch.backend import torch_build

            p.error(f"--device cuda: {torch_build()} (--device cpu runs the probe at tiny shapes)")
    record = run(args.device, stages, args.out)
    failed = [k for k, v in record["stages"].items() if not v["ok"]]
    print(f"{len(stages) - len(failed)} passed, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else "")
          + f"; {args.out}")  # fmt: skip
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
