"""DeepSpeed's CPU ops, compiled once outside any training run (``make setup`` runs this module).

The first CPU run otherwise spends minutes compiling inside its Ray workers. Run as a module, it
also writes the venv's start-up line that lets every process link the ops from a path with a space
(``quoted_ldflags``).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The ops DeepSpeed's CPU accelerator JIT-compiles on first use (fused Adam for the optimizer,
#: shared-memory collectives for init_distributed); cached under TORCH_EXTENSIONS_DIR.
CPU_OPS = ("FusedAdamBuilder", "ShareMemCommBuilder")


def remove_stale_locks() -> list[Path]:
    """Remove the ``lock`` files of builds that were killed mid-way; returns them.

    torch's JIT builder holds ``<extensions dir>/<op>/lock`` while it compiles and waits, with no
    limit, for a lock it finds to go away: a killed build would stall every later load of that op.
    Only for the set-up step, when nothing else builds.
    """
    from torch.utils.cpp_extension import get_default_build_root

    # torch builds in $TORCH_EXTENSIONS_DIR/<op>, else in <cache>/torch_extensions/py311_cpu/<op>
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    locks = sorted(Path(root).glob("*/lock") if root else Path(get_default_build_root()).glob("*/*/lock"))
    for lock in locks:
        lock.unlink(missing_ok=True)
    return locks


def prebuild_ops() -> list[str]:
    """Compile (or load from the cache) DeepSpeed's CPU ops now; returns the builders loaded.

    Uses TORCH_EXTENSIONS_DIR like every later run (set it the same way).
    """
    os.environ["DS_ACCELERATOR"] = os.environ.get("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    loaded = []
    for name in CPU_OPS:
        builder = get_accelerator().create_op_builder(name)
        if builder is not None and builder.is_compatible():
            builder.load()
            loaded.append(name)
    return loaded


if __name__ == "__main__":  # python -m rpg_openrlhf.cpu_backend.ops
    import time

    from rpg_openrlhf.cpu_backend.quoted_ldflags import install, write_pth

    write_pth()
    install()  # this process started before the line was there
    for lock in remove_stale_locks():
        print(f"removed {lock}: left by a build that was killed")
    start = time.time()
    ops = prebuild_ops()
    print(f"DeepSpeed CPU ops ready: {', '.join(ops)} ({time.time() - start:.0f} s)")
