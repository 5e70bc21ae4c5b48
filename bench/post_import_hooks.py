"""Post-import hooks: the hand-written finder cpu.py had (until the seam) vs ``wrapt.register_post_import_hook``.

Each round starts a fresh interpreter per variant (order alternating), which registers hooks on
``--hooked`` of ``--modules`` generated modules, imports all of them and reports the time of
registration + imports (the hooks only count calls). Ratios are medians over the rounds of
variant / baseline (no hooks) measured side by side. The hand-written implementation is loaded
from the git commit that still had it (``--commit``).

    .venv/bin/python bench/post_import_hooks.py --rounds 15
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HAND_COMMIT = "6f408a9"

CHILD = r"""
import importlib, sys, time, types
variant, root, n, hooked, hand_src = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sys.path.insert(0, root)
calls = []
def hook(module):
    calls.append(module.__name__)
t0 = time.perf_counter()
if variant == "hand":
    mod = types.ModuleType("hand_hooks")
    src = open(hand_src).read()
    start = src.index("_HOOKS: dict")
    end = src.index("# ----------------------------------------------------------------------- worker-side")
    header = "import importlib.abc, importlib.machinery, sys, threading\nfrom collections.abc import Callable\nfrom types import ModuleType\nfrom typing import Any\n"
    exec(header + src[start:end], mod.__dict__)
    for i in range(hooked):
        mod.when_imported(f"m{i:04d}", hook)
elif variant == "wrapt":
    import wrapt
    for i in range(hooked):
        wrapt.register_post_import_hook(hook, f"m{i:04d}")
for i in range(n):
    importlib.import_module(f"m{i:04d}")
dt = time.perf_counter() - t0
assert len(calls) == (hooked if variant != "none" else 0), calls
print(dt)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--modules", type=int, default=300)
    p.add_argument("--hooked", type=int, default=8, help="hooked modules (the CPU backend hooks 8)")
    p.add_argument("--commit", default=HAND_COMMIT)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(a.modules):
            (root / f"m{i:04d}.py").write_text(f"X = {i}\n")
        hand = root / "hand_cpu.py"
        hand.write_text(
            subprocess.run(
                ["git", "-C", str(REPO), "show", f"{a.commit}:rpg_openrlhf/integration/cpu.py"],
                check=True, capture_output=True, text=True,
            ).stdout
        )  # fmt: skip
        times: dict[str, list[float]] = {"none": [], "hand": [], "wrapt": []}
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        for r in range(a.rounds):
            order = ["none", "hand", "wrapt"] if r % 2 == 0 else ["wrapt", "hand", "none"]
            for v in order:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, v, str(root), str(a.modules), str(a.hooked), str(hand)],
                    check=True, capture_output=True, text=True, env=env,
                ).stdout  # fmt: skip
                times[v].append(float(out.strip()))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {k: statistics.median(t / b for t, b in zip(times[k], times["none"])) for k in ("hand", "wrapt")}
    print(f"{a.modules} imports, {a.hooked} hooked, {a.rounds} rounds (median)")
    for k in ("none", "hand", "wrapt"):
        extra = "" if k == "none" else f"   x{ratio[k]:.3f} of no hooks"
        print(f"  {k:6s} {med[k] * 1e3:8.2f} ms{extra}")
    print(f"  wrapt / hand: x{statistics.median(w / h for w, h in zip(times['wrapt'], times['hand'])):.3f}")
    if a.json:
        a.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "times": times}, indent=1)
        )


if __name__ == "__main__":
    main()
