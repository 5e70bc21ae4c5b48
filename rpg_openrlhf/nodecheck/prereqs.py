"""The node's CUDA prerequisites, read before anything runs on it (``scripts/setup_gpu.sh`` after it
installs torch, and the first line of ``make gpu-check``): the NVIDIA driver new enough for torch's
CUDA (13 needs >= 580, 12.x >= 525: NVIDIA's release notes), ``torch.cuda.is_available()``, and
``nvcc`` of torch's CUDA major where torch's ``cpp_extension`` looks (DeepSpeed JIT-compiles FusedAdam
at the first training step unless built with ``DS_BUILD_FUSED_ADAM=1``). Each problem is one line
naming the fix; :func:`problems` takes plain :class:`Facts`, :func:`gather` reads the real ones (no
torch import at module level: set-up runs it before the package is installed).

``python -m rpg_openrlhf.nodecheck.prereqs``: the lines, exit 1 when one fails, 0 when none.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: The lowest NVIDIA driver branch of each CUDA major (NVIDIA's table, Linux x86_64).
DRIVER_FOR_CUDA = {12: 525, 13: 580}
NVCC_FIX = (
    "install the CUDA {major} toolkit and point CUDA_HOME at it (its bin/nvcc), or install DeepSpeed with "
    "DS_BUILD_FUSED_ADAM=1 on a machine that has that nvcc (FusedAdam prebuilt: no JIT at the first step)"
)


@dataclass(frozen=True)
class Facts:
    """What the checks read: torch's build, the driver, nvcc, DeepSpeed's prebuilt ops."""

    torch_version: str
    torch_cuda: str | None  # torch.version.cuda, None for a CPU build
    cuda_available: bool
    driver: str | None  # nvidia-smi's driver_version, None when nvidia-smi is missing or fails
    nvcc_output: str | None  # ``nvcc --version``, None when no nvcc was found
    nvcc_path: str | None = None
    fused_adam_prebuilt: bool = False


def _first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def parse_driver(text: str | None) -> tuple[int, ...] | None:
    """``nvidia-smi --query-gpu=driver_version --format=csv,noheader``'s first line, e.g. (580, 65, 6)."""
    line = _first_line(text)
    if not re.fullmatch(r"\d+(\.\d+)*", line):
        return None
    return tuple(int(part) for part in line.split("."))


def parse_nvcc(text: str | None) -> tuple[int, int] | None:
    """``nvcc --version``'s "release 13.0" as (13, 0)."""
    match = re.search(r"release (\d+)\.(\d+)", text or "")
    return (int(match[1]), int(match[2])) if match else None


def cuda_major(version: str | None) -> int | None:
    match = re.match(r"(\d+)", version or "")
    return int(match[1]) if match else None


def problems(f: Facts) -> list[str]:
    """One line per unmet prerequisite, each naming its fix; [] when the node is ready."""
    major = cuda_major(f.torch_cuda)
    if major is None:
        return [f"torch {f.torch_version} has no CUDA (a CPU wheel): install torch==2.13.0 from PyPI "
                "(its Linux wheel is CUDA 13) or set TORCH_INDEX_URL to a CUDA index"]  # fmt: skip
    out = []
    needed = DRIVER_FOR_CUDA.get(major, max(DRIVER_FOR_CUDA.values()))
    driver = parse_driver(f.driver)
    if driver is None:
        out.append(f"nvidia-smi not found or unreadable: install the NVIDIA driver >= {needed} "
                   f"(torch {f.torch_version} is built for CUDA {f.torch_cuda})")  # fmt: skip
    elif driver[0] < needed:
        out.append(f"NVIDIA driver {_first_line(f.driver)} is older than {needed}, which torch "
                   f"{f.torch_version}'s CUDA {f.torch_cuda} needs: install driver >= {needed} "
                   "(e.g. the nvidia-driver-580 package, then reboot)")  # fmt: skip
    if not f.cuda_available and driver is not None and driver[0] >= needed:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        out.append(f"torch.cuda.is_available() is False with driver {_first_line(f.driver)}: "
                   f"check CUDA_VISIBLE_DEVICES ({visible!r}), /dev/nvidia* and the container's GPU flags "
                   "(docker --gpus all)")  # fmt: skip
    if not f.fused_adam_prebuilt:
        nvcc = parse_nvcc(f.nvcc_output)
        if nvcc is None:
            out.append("nvcc not found (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda): DeepSpeed JIT-compiles "
                       "FusedAdam at the first training step with it: " + NVCC_FIX.format(major=major))  # fmt: skip
        elif nvcc[0] != major:
            out.append(f"nvcc {nvcc[0]}.{nvcc[1]} ({f.nvcc_path}) but torch's CUDA is {f.torch_cuda}: "
                       "FusedAdam's JIT build needs the same major: " + NVCC_FIX.format(major=major))  # fmt: skip
    return out


def find_nvcc() -> str | None:
    """nvcc where torch's cpp_extension would look: CUDA_HOME / CUDA_PATH, PATH, /usr/local/cuda."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            path = os.path.join(os.environ[var], "bin", "nvcc")
            return path if os.path.isfile(path) else None
    return shutil.which("nvcc") or next((p for p in ["/usr/local/cuda/bin/nvcc"] if os.path.isfile(p)), None)


def _output(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _fused_adam_prebuilt() -> bool:
    """DeepSpeed's build record (``git_version_info_installed.py``, written by its setup.py), read without
    importing DeepSpeed (slow, and it may pick an accelerator)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return False
    path = os.path.join(list(spec.submodule_search_locations)[0], "git_version_info_installed.py")
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return False
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "installed_ops" for t in node.targets
        ):
            try:
                return bool(ast.literal_eval(node.value).get("fused_adam"))
            except ValueError:
                return False
    return False


def gather() -> Facts:
    """The facts of this machine (imports torch; runs nvidia-smi and nvcc)."""
    import torch

    nvcc = find_nvcc()
    return Facts(
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        cuda_available=bool(torch.version.cuda) and torch.cuda.is_available(),
        driver=_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        nvcc_output=_output([nvcc, "--version"]) if nvcc else None,
        nvcc_path=nvcc,
        fused_adam_prebuilt=_fused_adam_prebuilt(),
    )


def summary(f: Facts) -> str:
    """One line of what was found, e.g. ``driver 580.65.06, torch 2.13.0+cu130 (CUDA 13.0), nvcc 13.0``."""
    nvcc = parse_nvcc(f.nvcc_output)
    return (
        f"driver {_first_line(f.driver) or 'none'}, torch {f.torch_version} "
        f"(CUDA {f.torch_cuda or 'none'}), nvcc {f'{nvcc[0]}.{nvcc[1]}' if nvcc else 'none'}"
        + (", FusedAdam prebuilt" if f.fused_adam_prebuilt else "")
    )


def main() -> None:
    facts = gather()
    found = problems(facts)
    for line in found:
        print(f"prereqs: error: {line}", file=sys.stderr)
    print(f"[prereqs] {summary(facts)}: " + ("FAIL" if found else "ready"), file=sys.stderr)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
