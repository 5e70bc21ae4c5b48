"""Helpers for the worker scripts that run real DeepSpeed on 2 gloo ranks (CPU), started with spawn.

* :func:`run_script` runs such a script (``tests/helpers/NAME``) from a test, in a fresh process;
* :func:`spawn` starts ``fn(rank, *args)`` in ``world`` processes that share a free local port, each
  with DeepSpeed's distributed environment initialised on gloo;
* :func:`deferring` is DeepSpeed's ``all_gather_into_tensor`` with the worst timing an async
  all-gather may legally have. An asynchronous collective's output is defined only once its handle
  has been waited for; gloo honours that loosely (its worker threads may finish an earlier
  all-gather after a later one), so a missing wait shows about once in 2,000 gathers. The deferred
  version runs the real all-gather into a scratch buffer, leaves the output NaN, and copies the
  result in only when the handle is waited for: a missing wait then shows every time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, timeout: float = 600) -> str:
    """``python tests/helpers/NAME ARGS`` with DeepSpeed's CPU accelerator (and the venv's compiled
    ops); its stdout. A failure raises with the tail of its stderr."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / name), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc.stdout


def _start(rank: int, world: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    os.environ.update(
        {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": str(port), "DS_ACCELERATOR": "cpu"}
    )  # fmt: skip
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    fn(rank, *args)


def spawn(fn: Callable[..., None], *args: Any, world: int = 2) -> None:
    """``fn(rank, *args)`` on ``world`` gloo ranks; returns when all have finished (raises if one failed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_start, args=(world, port, fn, args), nprocs=world, join=True)


def deferring(real):  # type: ignore[no-untyped-def]
    """``all_gather_into_tensor`` whose async result lands in ``output`` only at ``wait()``; and the
    list its calls are counted in."""
    calls = []

    class Handle:
        def __init__(self, output: torch.Tensor, result: torch.Tensor) -> None:
            self.output, self.result = output, result

        def wait(self) -> None:
            self.output.copy_(self.result)

    def all_gather_into_tensor(output, tensor, group=None, async_op=False):  # type: ignore[no-untyped-def]
        calls.append(1)
        result = torch.empty_like(output)
        real(result, tensor, group=group, async_op=False)
        if not async_op:
            output.copy_(result)
            return None
        output.fill_(float("nan"))
        return Handle(output, result)

    return all_gather_into_tensor, calls
