"""rpg-mechanisms conformance (issue 39): every framework whose install is part of set-up (OpenRLHF, TRL,
verl: requirements/conformance.txt) runs from its own code on the enumerable policy, in a process of
its own (the command, --quick), and every registered option equals it; today's verdicts are pinned
per framework version (a later version is reported as a changed row, not failed); the committed table
and the docs are this code's."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest

from rpg_openrlhf.mechanisms import conformance as C
from rpg_openrlhf.mechanisms import conformance_report as CR
from rpg_openrlhf.mechanisms.upstream import CONFORMANCE_DIR, DISTRIBUTIONS

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "results" / "mechanisms" / "exp6_conformance_summary.csv"

#: (framework, version) -> option -> level -> (the divergence its code descends on-policy, whether it is
#: still that gradient exactly at KL(pi_old || pi_theta) = 0.1 with a fixed pi_ref)
PINS: dict[tuple[str, str], dict[str, dict[str, tuple[str, bool]]]] = {
    ("OpenRLHF", "0.11.2"): {
        "--algo.kl.use_loss --algo.kl.estimator k1": {"token": ("zero", False), "sequence": ("zero", False)},
        "--algo.kl.use_loss --algo.kl.estimator k2": {"token": ("rkl", False), "sequence": ("rkl", False)},
        "--algo.kl.use_loss --algo.kl.estimator k3": {"token": ("fkl", False), "sequence": ("fkl", False)},
        "--algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.unbiased_gradient": {"token": ("rkl", True),
                                                                                 "sequence": ("rkl", True)},
        "--algo.kl.estimator k1 (KL in the reward)": {"token": ("seq_rkl", False), "sequence": ("rkl", False)},
        "--algo.kl.estimator k2 (KL in the reward)": {"token": ("seq_rkl", False), "sequence": ("urkl", False)},
        "--algo.kl.estimator k3 (KL in the reward)": {"token": ("seq_rkl", False), "sequence": ("urkl", False)},
    },
    ("verl", "0.9.1"): {
        "use_kl_loss, kl_loss_type=k1": {"token": ("zero", False), "sequence": ("zero", False)},
        "use_kl_loss, kl_loss_type=k2": {"token": ("rkl", False), "sequence": ("rkl", False)},
        "use_kl_loss, kl_loss_type=abs": {"token": ("seq_rkl", False), "sequence": ("rkl", False)},
        "use_kl_loss, kl_loss_type=low_var_kl": {"token": ("fkl", False), "sequence": ("fkl", False)},
        **{f"use_kl_loss, kl_loss_type={k}": {"token": ("rkl", False), "sequence": ("rkl", False)}
           for k in ("k3+", "k1+", "abs+")},
    },
    ("TRL", "1.16.0"): {
        "beta > 0, use_bias_correction_kl=False": {"token": ("fkl", False), "sequence": ("fkl", False)},
        "beta > 0, use_bias_correction_kl=True (the default)": {"token": ("rkl", True), "sequence": ("rkl", True)},
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[pd.DataFrame, Path]:
    """`rpg-mechanisms conformance --quick` in a process of its own (TRL and verl, and the global state
    their trainer sets, stay out of this test process); its summary and output directory."""
    out = tmp_path_factory.mktemp("conformance") / "out"
    proc = subprocess.run([sys.executable, "-m", "rpg_openrlhf.mechanisms.run", "conformance", "--quick", "--out",
                           str(out)], capture_output=True, text=True, timeout=1200, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_csv(out / "exp6_conformance_summary.csv"), out


def _installed(dist: str) -> str:
    return metadata.version(dist) if dist == "openrlhf" else next(
        d.version for d in metadata.distributions(path=[str(CONFORMANCE_DIR)]) if d.metadata["Name"].lower() == dist
    )  # fmt: skip


def test_every_set_up_framework_runs_from_its_own_code(run) -> None:
    summ, out = run
    up = summ[summ["implementation"] == "upstream code"]
    assert set(up["framework"]) == {"OpenRLHF", "TRL", "verl"}
    for framework, version in zip(up["framework"], up["version"]):
        assert version == _installed(DISTRIBUTIONS[framework]), framework  # the version is the installed one
    assert len(up) == 2 * sum(o.calls != "" for o in C.OPTIONS) == 2 * 16
    for name in ("exp6_conformance.csv", "exp6_conformance.md", "exp6_conformance.png"):
        assert (out / name).stat().st_size > 1000, name
    assert set(summ[summ["implementation"] == C.REIMPLEMENTATION]["framework"]) == {
        "slime",
        "NeMo-RL",
        "DeepSeek-V3.2",
    }


def test_every_registered_option_equals_its_frameworks_code(run) -> None:
    """To 1e-12 where upstream computes in float64 (verl), to float32 rounding where it casts (OpenRLHF's
    compute_approx_kl, TRL's LM head), in every case and per entry at extreme log-ratios."""
    summ, _ = run
    up = summ[summ["implementation"] == "upstream code"]
    assert up["agrees"].astype(bool).all(), up[~up["agrees"].astype(bool)][
        ["option", "level", "agreement_max"]
    ]
    f64 = up[up["arithmetic"] == "float64"]
    assert len(f64) == 14 and f64["agreement_max"].max() <= 1e-12
    assert up["agreement_max"].max() <= C.AGREE_FLOAT32
    tok = up[up["level"] == "token"]
    assert tok["extreme_agreement"].notna().all() and tok["extreme_agreement"].max() <= C.EXTREME


def test_todays_verdicts_are_pinned_per_version(run) -> None:
    """A framework version without pins (a later release) is reported, not failed: its rows are in the
    table; the pinned ones must read the same."""
    summ, _ = run
    for (framework, version), d in summ[summ["implementation"] == "upstream code"].groupby(
        ["framework", "version"]
    ):
        pins = PINS.get((framework, version))
        if pins is None:
            pinned = [v for f, v in PINS if f == framework]
            warnings.warn(f"{framework} {version}: no pinned verdicts (pins: {pinned}); see its rows in the table",
                          stacklevel=1)  # fmt: skip
            continue
        exact = 1e-5 if d["arithmetic"].iloc[0] != "float64" else 1e-8
        got = {o: {r["level"]: (r["target"], bool(r["drift_fixed_ref@0.1"] < exact)) for _, r in g.iterrows()}
               for o, g in d.groupby("option")}  # fmt: skip
        assert got == pins, framework


def test_a_later_version_is_a_changed_row_not_a_failure(run) -> None:
    summ, _ = run
    later = summ.copy()
    later.loc[later["framework"] == "TRL", "version"] = "99.0"
    with pytest.warns(UserWarning, match="TRL 99.0: no pinned verdicts"):
        test_todays_verdicts_are_pinned_per_version((later, None))


def test_the_committed_table_is_this_codes(run) -> None:
    """results/mechanisms/exp6_conformance_summary.csv (the full run) reads what a fresh run reads: the same
    rows, versions, on-policy targets and agreement."""
    summ, _ = run
    committed = pd.read_csv(COMMITTED)
    cols = ["framework", "version", "option", "loss", "level", "target", "agrees"]
    assert committed[cols].astype(str).equals(summ[cols].astype(str))


def test_docs_lead_with_the_conformance_table() -> None:
    docs = (REPO / "docs" / "kl-options.md").read_text()
    table = CR.table(pd.read_csv(COMMITTED))
    assert table in docs and docs.index(table) < docs.index("## The options and their sources")
    assert docs.index(table) < 4000  # it leads


def test_a_missing_framework_is_one_line_and_nothing_is_written(tmp_path) -> None:
    env = {**os.environ, "RPG_CONFORMANCE_DIR": str(tmp_path / "empty")}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "rpg_openrlhf.mechanisms.run", "conformance", "--quick", "--out",
                           str(out)], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)  # fmt: skip
    last = [x for x in proc.stderr.splitlines() if x.strip()][-1]
    assert proc.returncode != 0 and "conformance: verl, TRL not installed; `make setup` installs them" in last
    assert not out.exists()
