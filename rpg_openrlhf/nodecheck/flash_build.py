"""flash-attn on a GPU node: a build for this node only, and a prebuilt post release that survives set-up.

**The build.** flash-attn 2.8.3's ``setup.py`` compiles every kernel for each architecture in
``FLASH_ATTN_CUDA_ARCHS`` (default "80;90;100;120"), ``MAX_JOBS`` jobs at a time; no prebuilt wheel
exists for torch 2.13 (CUDA 13), so ``pip install`` compiles. :func:`build_env` builds for the node's
own architecture only (sm_80 code serves 8.x GPUs) with ``MAX_JOBS`` from the cores (half, flash-attn's
default) and the available memory (9 GiB a job: our allowance). Upstream reports 10-30 minutes for one
architecture at 32+ jobs; several hours at the defaults.

**The post release.** Upstream's only cu13 wheels are 2.8.3.post1 (``FLASH_ATTN_WHEEL=``), which the pin
``flash-attn==2.8.3`` (requirements/gpu.txt, OpenRLHF 0.11.2's Requires-Dist) rejects (PEP 440), so
installing ``openrlhf[vllm]`` afterwards replaced it by the sdist. Set-up's step 3 therefore installs
OpenRLHF with ``--no-deps`` and then :func:`step3_requirements` (``pip check`` then names the one
intended mismatch, OpenRLHF's ``flash-attn==2.8.3``).

``python -m rpg_openrlhf.nodecheck.flash_build env``: ``KEY=VALUE`` lines for the build. ``... step3 --out
FILE``: step 3's requirement file, from this environment's OpenRLHF metadata and flash-attn.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from rpg_openrlhf.common.atomic import write_file

#: The architectures flash-attn 2.8.3's setup.py builds (its FLASH_ATTN_CUDA_ARCHS default).
FLASH_ARCHS = (80, 90, 100, 120)
#: The release OpenRLHF 0.11.2 pins; its post releases are the same code with other wheels.
FLASH_RELEASE = "2.8.3"
GIB_PER_JOB = 9
REPO = Path(__file__).resolve().parents[2]


def arch_for(capability: tuple[int, int]) -> int:
    """flash-attn's architecture for a GPU of compute capability (major, minor): 8.x -> 80 (Ampere SASS
    runs on 8.6 / 8.9), 9.0 -> 90, 10.x -> 100, 12.x -> 120. Raises ValueError below 8.0."""
    major, _minor = capability
    arch = major * 10
    if arch not in FLASH_ARCHS:
        raise ValueError(
            f"compute capability {major}.{_minor}: flash-attn 2.8.3 builds for sm_80 (Ampere) and newer "
            f"({', '.join(map(str, FLASH_ARCHS))}) only"
        )
    return arch


def archs(capabilities: Iterable[tuple[int, int]]) -> str:
    """``FLASH_ATTN_CUDA_ARCHS`` for these GPUs, e.g. "90" for H100s ("80;90" for a mixed node)."""
    found = sorted({arch_for(c) for c in capabilities})
    if not found:
        raise ValueError("no GPU visible: cannot tell which architecture to build flash-attn for")
    return ";".join(map(str, found))


def max_jobs(cores: int, available_gib: float) -> int:
    """Compile jobs: half the cores, and one per GIB_PER_JOB GiB of available memory; at least 1."""
    return max(1, min(cores // 2, int(available_gib // GIB_PER_JOB)))


def _available_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 8.0


def build_env() -> dict[str, str]:
    """The build's environment for this node (imports torch; needs its GPUs visible)."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError("torch.cuda.is_available() is False: cannot read the GPUs' architecture")
    caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {
        "FLASH_ATTN_CUDA_ARCHS": os.environ.get("FLASH_ATTN_CUDA_ARCHS") or archs(caps),
        "MAX_JOBS": os.environ.get("MAX_JOBS") or str(max_jobs(cores, _available_gib())),
        "NVCC_THREADS": os.environ.get("NVCC_THREADS") or "4",
    }


def _requirements(lines: Iterable[str]) -> list[Requirement]:
    out = []
    for line in lines:
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            out.append(Requirement(line))
    return out


def step3_requirements(
    gpu_lines: Iterable[str], openrlhf_requires: Iterable[str], flash_version: str
) -> list[str]:
    """Step 3's requirement lines (module docstring): gpu.txt without openrlhf and flash-attn, then
    OpenRLHF's Requires-Dist for the vllm extra not already named, then the installed flash-attn."""
    version = Version(flash_version)
    if version.release[:3] != Version(FLASH_RELEASE).release:
        raise ValueError(
            f"flash-attn {flash_version} installed: OpenRLHF 0.11.2 is built against {FLASH_RELEASE} "
            "(a post release of it, e.g. 2.8.3.post1, is fine)"
        )
    drop = {"openrlhf", "flash-attn"}
    out, named = [], set()
    for req in _requirements(gpu_lines):
        name = canonicalize_name(req.name)
        if name not in drop:
            out.append(str(req))
            named.add(name)
    for req in _requirements(openrlhf_requires):
        name = canonicalize_name(req.name)
        if req.marker is not None and not req.marker.evaluate({"extra": "vllm"}):
            continue
        if name not in drop and name not in named:
            req.marker = None
            out.append(str(req))
            named.add(name)
    return [*out, f"flash-attn=={version.public}"]


def _write_step3(out: Path) -> None:
    from importlib.metadata import requires, version

    lines = step3_requirements(
        (REPO / "requirements" / "gpu.txt").read_text().splitlines(),
        requires("openrlhf") or [],
        version("flash-attn"),
    )
    write_file(out, "".join(f"{line}\n" for line in lines))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m rpg_openrlhf.nodecheck.flash_build", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="KEY=VALUE lines of flash-attn's build for this node")
    step3 = sub.add_parser("step3", help="set-up step 3's requirement file")
    step3.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        if args.command == "env":
            print("\n".join(f"{k}={v}" for k, v in build_env().items()))
        else:
            _write_step3(args.out)
    except ValueError as exc:
        p.exit(1, f"flash_build: error: {exc}\n")


if __name__ == "__main__":
    main()
