"""A GPU node's CUDA prerequisites and flash-attn's build, without a GPU (issue 29, faults 1 and 2):

* ``rpg_openrlhf.nodecheck.prereqs`` on fake ``nvidia-smi`` / ``nvcc`` outputs (copied from those tools'
  formats): a pre-580 driver under torch's CUDA 13, no nvcc, an nvcc of another major, each one line
  naming its fix; set-up runs it right after torch (tests/test_gpu_requirements.py), and ``make
  gpu-check``'s first line reports it (before "no GPU visible" could blame CUDA_VISIBLE_DEVICES);
* ``rpg_openrlhf.nodecheck.flash_build``: the node's own architecture, MAX_JOBS from cores and memory,
  and step 3's requirements keeping a prebuilt 2.8.3.post1 (``FLASH_ATTN_WHEEL=``) that the pin
  ``flash-attn==2.8.3`` would have replaced.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_gpu_requirements import setup_dry_run

from rpg_openrlhf.nodecheck import flash_build, prereqs

REPO = Path(__file__).resolve().parents[1]
# the tools' own formats (nvidia-smi's csv query, one line per GPU; nvcc --version)
SMI_580 = "580.65.06\n580.65.06\n"
SMI_570 = "570.133.20\n"
NVCC_13 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Jul_16_07:30:01_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.48
Build cuda_13.0.r13.0/compiler.36260728_0
"""
NVCC_12 = NVCC_13.replace("release 13.0, V13.0.48", "release 12.8, V12.8.93")
READY = prereqs.Facts("2.13.0+cu130", "13.0", True, SMI_580, NVCC_13, "/usr/local/cuda/bin/nvcc")
POST1 = "2.8.3.post1+cu13torch2.13cxx11abitrue"


def test_a_ready_node_has_no_problem() -> None:
    assert prereqs.problems(READY) == []
    # CUDA 12 torch: 525 is enough; a prebuilt FusedAdam needs no nvcc
    assert (
        prereqs.problems(dataclasses.replace(READY, torch_cuda="12.8", driver="535.1\n", nvcc_output=NVCC_12))
        == []
    )
    assert prereqs.problems(dataclasses.replace(READY, nvcc_output=None, fused_adam_prebuilt=True)) == []


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"driver": SMI_570}, ["NVIDIA driver 570.133.20 is older than 580", "CUDA 13.0", "install driver >= 580"]),
        ({"driver": None}, ["nvidia-smi not found", ">= 580"]),
        ({"cuda_available": False}, ["torch.cuda.is_available() is False with driver 580.65.06",
                                     "CUDA_VISIBLE_DEVICES"]),
        ({"nvcc_output": None}, ["nvcc not found", "FusedAdam", "CUDA 13 toolkit", "DS_BUILD_FUSED_ADAM=1"]),
        ({"nvcc_output": NVCC_12}, ["nvcc 12.8 (/usr/local/cuda/bin/nvcc) but torch's CUDA is 13.0",
                                    "DS_BUILD_FUSED_ADAM=1"]),
        ({"torch_cuda": None, "torch_version": "2.13.0+cpu"}, ["torch 2.13.0+cpu has no CUDA"]),
    ],
)  # fmt: skip
def test_each_problem_is_one_line_naming_its_fix(change: dict, needles: list[str]) -> None:
    found = prereqs.problems(dataclasses.replace(READY, **change))
    assert len(found) == 1 and "\n" not in found[0], found
    assert all(n in found[0] for n in needles), found


def _fake_tools(tmp_path: Path, smi: str, nvcc: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nvidia-smi", smi), ("nvcc", nvcc)):
        (bin_dir / name).write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_gather_reads_the_tools(tmp_path: Path, monkeypatch) -> None:
    """nvidia-smi and nvcc found on PATH (no CUDA_HOME), their outputs parsed as the node's."""
    bin_dir = _fake_tools(tmp_path, SMI_570, NVCC_12)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    facts = prereqs.gather()
    assert prereqs.parse_driver(facts.driver) == (570, 133, 20) and facts.nvcc_path == str(bin_dir / "nvcc")
    assert (
        prereqs.parse_nvcc(facts.nvcc_output) == (12, 8)
        and prereqs.parse_driver("NVIDIA-SMI has failed") is None
    )
    as_cuda13 = dataclasses.replace(facts, torch_cuda="13.0", cuda_available=True, fused_adam_prebuilt=False)
    found = prereqs.problems(as_cuda13)
    assert len(found) == 2 and "older than 580" in found[0] and "nvcc 12.8" in found[1], found
    # CUDA_HOME wins over PATH, as in torch's cpp_extension
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    assert prereqs.gather().nvcc_output is None


def test_node_check_names_the_driver_first() -> None:
    """make gpu-check's environment line: the driver, not "no CUDA_VISIBLE_DEVICES" (issue 29)."""
    from rpg_openrlhf.nodecheck.environment import check_environment

    check = check_environment(1, facts=dataclasses.replace(READY, driver=SMI_570, cuda_available=False))
    assert not check.ok and "older than 580" in check.line() and "CUDA_VISIBLE_DEVICES" not in check.line()


# ----------------------------------------------------------------------------- flash-attn
def test_the_nodes_own_architecture() -> None:
    assert flash_build.archs([(9, 0)] * 8) == "90"
    assert flash_build.archs([(8, 9), (8, 0)]) == "80" and flash_build.archs([(8, 0), (9, 0)]) == "80;90"
    assert flash_build.archs([(10, 0)]) == "100" and flash_build.archs([(12, 0)]) == "120"
    with pytest.raises(ValueError, match="compute capability 7.5"):
        flash_build.archs([(7, 5)])
    with pytest.raises(ValueError, match="no GPU visible"):
        flash_build.archs([])


def test_max_jobs_from_cores_and_memory() -> None:
    assert flash_build.max_jobs(cores=128, available_gib=1900) == 64  # half the cores
    assert flash_build.max_jobs(cores=64, available_gib=100) == 11  # 9 GiB a job
    assert flash_build.max_jobs(cores=2, available_gib=4) == 1


#: OpenRLHF 0.11.2's Requires-Dist, the lines that matter here (its METADATA)
OPENRLHF_REQUIRES = ["deepspeed==0.19.6", "einops", "flash-attn==2.8.3", "ray[default]==2.55.0", "torch",
                     "transformers==5.15.0", 'liger-kernel; extra == "liger"', 'vllm==0.29.0; extra == "vllm"']  # fmt: skip


def _flash_specs(lines: list[str]) -> list[Requirement]:
    reqs = [Requirement(line) for line in lines]
    return [r for r in reqs if canonicalize_name(r.name) == "flash-attn"]


def test_step3_keeps_a_post_release() -> None:
    """Every flash-attn requirement of step 3 accepts the installed 2.8.3.post1 (+cu13 local label);
    the set before (gpu.txt and openrlhf[vllm]'s own) rejected it, so pip replaced it by the sdist."""
    gpu = (REPO / "requirements" / "gpu.txt").read_text().splitlines()
    lines = flash_build.step3_requirements(gpu, OPENRLHF_REQUIRES, POST1)
    assert lines[-1] == "flash-attn==2.8.3.post1"
    assert all(r.specifier.contains(POST1) for r in _flash_specs(lines))
    old = [line.split("#")[0].strip() for line in gpu if line.split("#")[0].strip()] + OPENRLHF_REQUIRES
    assert not all(r.specifier.contains(POST1) for r in _flash_specs(old))  # the fault
    names = [canonicalize_name(Requirement(line).name) for line in lines]
    assert "openrlhf" not in names and len(names) == len(set(names)), names
    assert {"vllm==0.29.0", "torch==2.13.0", "deepspeed==0.19.6", "einops"} <= set(lines)
    assert not any("liger" in line or ";" in line for line in lines)
    with pytest.raises(ValueError, match="flash-attn 2.7.4 installed"):
        flash_build.step3_requirements(gpu, OPENRLHF_REQUIRES, "2.7.4")


def test_set_up_with_a_wheel_keeps_it(tmp_path: Path) -> None:
    """FLASH_ATTN_WHEEL=<a post1 wheel>: installed with --no-deps, nothing builds flash-attn afterwards,
    OpenRLHF comes with --no-deps and the package without the gpu extra (openrlhf[vllm] again)."""
    wheel = tmp_path / f"flash_attn-{POST1}-cp311-cp311-linux_x86_64.whl"
    steps = setup_dry_run(FLASH_ATTN_WHEEL=str(wheel))
    assert any(s.endswith(f"--no-deps {wheel}") for s in steps), steps
    assert not any("flash-attn==" in s for s in steps), steps
    no_deps = next(i for i, s in enumerate(steps) if "--no-deps openrlhf==0.11.2" in s)
    step3 = next(i for i, s in enumerate(steps) if "flash_build step3" in s)
    install = next(i for i, s in enumerate(steps) if "[dev]" in s)
    assert no_deps < step3 < install and "[gpu" not in steps[install] and "constraints.txt" in steps[install]
