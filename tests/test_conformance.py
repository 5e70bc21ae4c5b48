"""rpg-mechanisms conformance (issue 39): every framework whose install is part of set-up (OpenRLHF, TRL,
verl: requirements/conformance.txt) runs from its own code on the enumerable policy, in a process of
its own (the command, --quick), and every registered option equals it; today's verdicts are pinned
per framework version; the committed table and the docs are this code's."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rpg_openrlhf.mechanisms import conformance as C
from rpg_openrlhf.mechanisms import conformance_report as CR
from rpg_openrlhf.mechanisms.upstream import CONFORMANCE_DIR, DISTRIBUTIONS

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "results" / "mechanisms" / "exp6_conformance_summary.csv"


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
    reimplemented = summ[summ["implementation"] == C.REIMPLEMENTATION]
    assert set(reimplemented["framework"]) == {"slime", "NeMo-RL", "DeepSeek-V3.2"}


def test_every_registered_option_equals_its_frameworks_code(run) -> None:
    """To 1e-12 where upstream computes in float64 (verl), to float32 rounding where it casts (OpenRLHF's
    compute_approx_kl, TRL's LM head), in every case and per entry at extreme log-ratios."""
    summ, _ = run
    up = summ[summ["implementation"] == "upstream code"]
    differs = up[~up["agrees"].astype(bool)]
    assert differs.empty, differs[["option", "level", "agreement_max"]]
    f64 = up[up["arithmetic"] == "float64"]
    assert len(f64) == 14 and f64["agreement_max"].max() <= 1e-12
    assert up["agreement_max"].max() <= C.AGREE_FLOAT32
    tok = up[up["level"] == "token"]
    assert tok["extreme_agreement"].notna().all() and tok["extreme_agreement"].max() <= C.EXTREME


def test_the_committed_table_is_this_codes(run) -> None:
    """results/mechanisms/exp6_conformance_summary.csv (the full run) reads what a fresh run reads: the same
    rows, versions, on-policy readings and agreement, and in the cases --quick shares with it the same
    distances (at KL(pi_old || pi_theta) = 0.1, at extreme log-ratios). Today's verdicts are thereby pinned
    per framework version: a later version is a changed row."""
    summ, _ = run
    committed = pd.read_csv(COMMITTED)
    cols = ["framework", "version", "option", "loss", "level", "target", "on_policy_descends", "agrees"]
    assert committed[cols].astype(str).equals(summ[cols].astype(str))
    num = ["drift_fixed_ref@0.1", "drift_ref_old@0.1", "extreme_agreement", "deep_l_agreement"]
    np.testing.assert_allclose(summ[num], committed[num], rtol=1e-6, atol=1e-9)


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
