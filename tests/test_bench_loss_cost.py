"""bench/loss_cost.py compares like with like inside one training step: on the benchmark's own inputs
(a small head), RPG's grpo_kl is OpenRLHF's PolicyLoss + beta k3 KL loss (value and gradients of the
hidden states and the head), the stock full-logits step and the chunked one agree, and a tiny run
reports both ratios for every paper loss (and refuses bad input)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def loss_cost():
    # The bench registers a bare `openrlhf.models` package (its process imports nothing else
    # from it); put the real modules back afterwards so later tests import OpenRLHF normally.
    def bench_modules() -> list[str]:
        return [k for k in sys.modules if k == "openrlhf.models" or k.startswith("openrlhf.models.")]

    saved = {k: sys.modules[k] for k in bench_modules()}
    sys.path.insert(0, str(BENCH))
    try:
        import loss_cost

        yield loss_cost
    finally:
        sys.path.remove(str(BENCH))
        for k in bench_modules():
            del sys.modules[k]
        sys.modules.update(saved)
        sys.modules.pop("loss_cost", None)


def test_the_steps_compute_the_same_loss_and_gradients(loss_cost):
    x = loss_cost.make_inputs(vocab=300, hidden=8, batch=3, tokens=16)
    steps = loss_cost.build_steps(x, [("grpo_kl", "differentiable"), ("urkl", "reinforce")])
    out = {}
    for name in ("openrlhf (chunked)", "openrlhf (stock)", "grpo_kl/differentiable", "urkl/reinforce"):
        loss = steps[name]()
        out[name] = (loss, x["hidden"].grad.clone(), x["weight"].grad.clone())
    base = out["openrlhf (chunked)"]
    for name in ("openrlhf (stock)", "grpo_kl/differentiable"):  # the same objective, the same inputs
        for got, want in zip(out[name], base):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    # a different loss gives a different value (-SG(coef) log pi_theta): the comparison above can fail
    assert not torch.allclose(out["urkl/reinforce"][0], base[0], rtol=1e-2)


def test_tiny_run_reports_both_ratios_for_every_paper_loss(loss_cost, tmp_path):
    out = loss_cost.main(["--vocab", "200", "--hidden", "8", "--batch", "2", "--tokens", "16", "--repeats", "1",
                          "--variants", "paper", "--json", str(tmp_path / "r.json")])  # fmt: skip
    from rpg_openrlhf.core import LOSS_NAMES, LOSSES, STYLES

    paper = {f"{n}/{s}" for n, s in LOSSES if n in LOSS_NAMES and s in STYLES}
    assert {r["variant"] for r in out["rows"]} == paper and len(paper) == 22
    for r in out["rows"]:
        assert min(r[k] for k in ("mem_ratio", "time_ratio", "user_time_ratio", "user_mem_ratio")) > 0
        assert r["mem_ratio"] == r["peak_bytes"] / out["baselines"]["openrlhf_chunked"]["peak_bytes"]
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == json.loads(json.dumps(out["rows"]))


@pytest.mark.parametrize("argv, needle", [(["--tokens", "0"], "--tokens: must be >= 1"),
                                          (["--report", "/nonexistent/r.json"], "--report /nonexistent/r.json")])  # fmt: skip
def test_bad_input_is_one_error_line_and_exit_2(argv, needle):
    done = subprocess.run(
        [sys.executable, str(BENCH / "loss_cost.py"), *argv], capture_output=True, text=True
    )
    assert done.returncode == 2 and "loss_cost.py: error: " in done.stderr and needle in done.stderr, (
        done.stderr
    )
