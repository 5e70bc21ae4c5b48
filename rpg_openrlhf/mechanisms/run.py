"""``rpg-mechanisms``: regenerate every table, plot and the README in results/mechanisms/.

    rpg-mechanisms [--out results/mechanisms] [--quick] [--seeds N]
    rpg-mechanisms conformance [--out results/mechanisms] [--quick]   # exp6: the frameworks' own code

--quick runs the same code paths with small sizes (the tests use it); the full run takes a few
minutes on 2 CPU cores. Everything is deterministic for the seeds used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from rpg_openrlhf.common.atomic import output_dir
from rpg_openrlhf.common.cliutil import OneLineParser, int_at_least, quiet_known_warnings, report_errors

quiet_known_warnings()  # before torch: its pynvml warning preceded every message, argument errors too

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from rpg_openrlhf.core import LossConfig  # noqa: E402

from . import atlas as A  # noqa: E402
from . import conformance as C  # noqa: E402
from . import conformance_report as CR  # noqa: E402
from . import experiments as E  # noqa: E402
from . import report as R  # noqa: E402
from . import toy as T  # noqa: E402
from .readme import readme_text  # noqa: E402

PROG = "rpg-mechanisms"


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between --quick and the full run."""

    exp1_drifts: tuple[float, ...]
    exp2: E.TrainConfig
    exp2_seeds: int
    fixed_point_steps: int
    exp3_drifts: tuple[float, ...]
    exp3_batches: int
    exp3_train: E.TrainConfig
    exp3_epochs: tuple[int, ...]
    exp3_seeds: int
    exp4: E.TrainConfig
    exp4_seeds: int
    exp5_kl_targets: tuple[float, ...] = A.KL_TARGETS
    exp5_steps: int = 600  # fixed points: converged to TV ~1e-9 at this step count (lr 0.1)
    exp5_only: tuple[str, ...] | None = None  # fixed points of these options only (None: all)
    exp6_kl_targets: tuple[float, ...] = A.KL_TARGETS  # conformance: the drifts of every case


BETA = 0.25  # exp 2/3: optima of RKL and FKL differ by TV 0.12 here (see README)
BETA_REF = 0.5  # exp 4: a fixed reference visibly caps the reward (pi* reward 0.64)

FULL = Sizes(
    exp1_drifts=(0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0),
    exp2=E.TrainConfig(loss=LossConfig(beta=BETA), rollouts=150, groups=32, minibatch=64, epochs=2),
    exp2_seeds=3,
    fixed_point_steps=3000,
    exp3_drifts=(0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5),
    exp3_batches=100,
    exp3_train=E.TrainConfig(name="rkl", loss=LossConfig(beta=BETA), rollouts=60, groups=16, minibatch=32),
    exp3_epochs=(1, 4),
    exp3_seeds=2,
    exp4=E.TrainConfig(
        style="reinforce_clip", loss=LossConfig(beta=BETA_REF), rollouts=150, groups=16, minibatch=32
    ),
    exp4_seeds=2,
)
QUICK = replace(
    FULL,
    exp1_drifts=(0.0, 0.5, 1.0, 2.0),
    exp2=replace(FULL.exp2, rollouts=30, groups=16, minibatch=32),
    exp2_seeds=1,
    fixed_point_steps=600,
    exp3_drifts=(0.0, 0.5, 2.0),
    exp3_batches=30,
    exp3_train=replace(FULL.exp3_train, rollouts=20),
    exp3_seeds=1,
    exp4=replace(FULL.exp4, rollouts=50),
    exp4_seeds=1,
    exp5_kl_targets=(0.0, 0.1),
    exp5_steps=20,
    exp5_only=("rkl/diff", "fkl/diff"),
    exp6_kl_targets=(0.0, 0.1),
)


def run_all(out: Path, quick: bool = False, seeds: int | None = None) -> dict[str, pd.DataFrame]:
    """Run experiments 1-5, write every output under ``out`` and return the frames (experiment 6, the
    frameworks' own code, is its own command: run_conformance).

    ``out`` is claimed before anything runs (``common.atomic.output_dir``: a new or empty directory,
    or one rpg-mechanisms marked; ``--out .`` holding a project's files is refused) and locked; the
    outputs are written into a temp directory inside it and moved over their names at the end: a
    failure changes nothing in ``out``."""
    if seeds is not None and seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")  # before any file is written
    with _staged(out) as staged:
        return _run_all(staged, QUICK if quick else FULL, quick, seeds)


def run_conformance(out: Path, quick: bool = False) -> dict[str, pd.DataFrame]:
    """Experiment 6 (`rpg-mechanisms conformance`): every framework's KL option run from its own code;
    its exp6_* files written under ``out`` (claimed and staged as run_all's), the rest left as it is."""
    C.require_frameworks()
    with _staged(out) as staged:
        t0, cpu0 = time.time(), time.process_time()
        rows = pd.DataFrame(C.measure(T.make_toy(4, 4), (QUICK if quick else FULL).exp6_kl_targets))
        summ = CR.outputs(rows, staged)
        timings = {"exp6": time.time() - t0, "cpu": time.process_time() - cpu0}
        return {"exp6_rows": rows, "exp6": summ, "timings": pd.DataFrame([timings])}


@contextlib.contextmanager
def _staged(out: Path) -> Iterator[Path]:
    """``out`` claimed (:func:`output_dir`), one torch thread (tiny tensors: threads only add overhead),
    and a temp directory in it for writers that take a path (pandas, matplotlib); on a clean exit
    each file written there replaces its name in ``out`` (``os.replace``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with output_dir(out, PROG) as target:
            staged = Path(tempfile.mkdtemp(prefix=".staging.", dir=target))
            try:
                yield staged
                for f in sorted(staged.iterdir()):
                    os.replace(f, target / f.name)
            finally:
                shutil.rmtree(staged, ignore_errors=True)
    finally:
        torch.set_num_threads(threads)


def _run_all(out: Path, sz: Sizes, quick: bool, seeds: int | None) -> dict[str, pd.DataFrame]:
    toy = T.make_toy(4, 4)
    res: dict[str, pd.DataFrame] = {}
    timings: dict[str, float] = {}
    cpu0 = time.process_time()

    @contextlib.contextmanager
    def timed(key: str) -> Iterator[None]:
        t0 = time.time()
        yield
        timings[key] = time.time() - t0

    with timed("exp1"):
        res["exp1"] = pd.DataFrame(E.exp1_kl_gradient_bias(toy, list(sz.exp1_drifts)))
        R.exp1_outputs(res["exp1"], out)
    with timed("exp2"):
        s2 = list(range(seeds or sz.exp2_seeds))
        runs, refs = E.exp2_where_training_ends(toy, sz.exp2, s2, fixed_point_steps=sz.fixed_point_steps)
        base_rows = E.exp2_baseline(toy, sz.exp2, s2)
        res["exp2_runs"], res["exp2_refs"], res["exp2_baseline"] = map(pd.DataFrame, (runs, refs, base_rows))
        res["exp2"] = R.exp2_outputs(res["exp2_runs"], res["exp2_refs"], res["exp2_baseline"], out)
    with timed("exp3"):
        var = E.exp3_clip_variance(toy, "rkl", BETA, list(sz.exp3_drifts), sz.exp3_batches, 8, 8)
        s3 = list(range(seeds or sz.exp3_seeds))
        trn = E.exp3_clip_training(toy, sz.exp3_train, list(sz.exp3_epochs), s3)
        res["exp3_var"], res["exp3_train"] = R.exp3_outputs(pd.DataFrame(var), pd.DataFrame(trn), out)
    with timed("exp4"):
        traj, finals = E.exp4_reference(toy, sz.exp4, list(range(seeds or sz.exp4_seeds)))
        betas = sorted({float(b) for b in torch.logspace(-1.3, 1.0, 40)} | {sz.exp4.loss.beta})
        res["exp4_frontier"] = pd.DataFrame(E.exp4_frontier(toy, sz.exp4.init_seed, betas))
        res["exp4_traj"] = pd.DataFrame(traj)
        res["exp4"] = R.exp4_outputs(
            res["exp4_traj"], pd.DataFrame(finals), res["exp4_frontier"], out, sz.exp4.loss.beta
        )
    with timed("exp5"):
        res["exp5_grads"] = pd.DataFrame(A.gradients(toy, sz.exp5_kl_targets))
        res["exp5_ends"] = pd.DataFrame(A.fixed_points(toy, BETA, sz.exp5_steps, sz.exp5_only))
        res["exp5"] = A.outputs(res["exp5_grads"], res["exp5_ends"], out)
    timings["cpu"] = time.process_time() - cpu0  # wall time depends on how loaded the machine is

    res["timings"] = pd.DataFrame([timings])
    (out / "README.md").write_text(readme_text(res, sz, quick, timings))
    return res


def main(argv: list[str] | None = None) -> None:
    """Every failure is one line ``rpg-mechanisms: error: ...``, exit 2."""
    sys.exit(report_errors(PROG, _main, argv))


def _main(argv: list[str]) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("experiments", nargs="?", choices=("all", "conformance"), default="all",
                    help="all: experiments 1-5 and the README (default); conformance: experiment 6, every "
                    "framework's KL option run from its own code (TRL and verl from make setup)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("results/mechanisms"), help="output directory")
    ap.add_argument("--quick", action="store_true", help="small sizes, same code paths (tests)")
    # Checked at parse time: a bad count must fail before any file is written.
    ap.add_argument(
        "--seeds", type=int_at_least(1), default=None, help="override the number of training seeds (>= 1)"
    )
    args = ap.parse_args(argv)
    t0 = time.time()
    if args.experiments == "conformance":
        res = run_conformance(args.out, quick=args.quick)
    else:
        res = run_all(args.out, quick=args.quick, seeds=args.seeds)
    print(
        f"wrote {args.out} in {time.time() - t0:.1f}s: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in res["timings"].iloc[0].items())
    )
    return 0


if __name__ == "__main__":
    main()
