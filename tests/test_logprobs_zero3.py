"""The chunked log-prob path under ZeRO-3 on 2 ranks (real DeepSpeed on gloo, CPU; heavy: run it under
``flock /tmp/heavy.lock``): the LM head's weight is partitioned, gathered by ZeRO's hooks once for the
chunked forward (the head is called once, not once per chunk), and the log-probs, the entropy and
every parameter's full gradient after the reduce-scatter equal OpenRLHF's ``Actor.forward`` in the
same engine (fp32: 1e-5 relative to the whole gradient's norm), tied and untied heads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from deepspeed_ranks import run_script  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_zero3_chunked_equals_openrlhf(tmp_path: Path, tied: bool) -> None:
    out = tmp_path / "record.json"
    run_script("logprobs_zero3_worker.py", str(out), "1" if tied else "0")
    record = json.loads(out.read_text())
    stock, chunked = record["stock"], record["chunked"]
    assert chunked["head_gathers"] == stock["head_gathers"] == [[97, 32]]  # full weight, one call
    torch.testing.assert_close(torch.tensor(chunked["logp"]), torch.tensor(stock["logp"]), rtol=0, atol=2e-6)
    torch.testing.assert_close(
        torch.tensor(chunked["entropy"]), torch.tensor(stock["entropy"]), rtol=0, atol=2e-5
    )
    grads_s = {n: torch.tensor(g) for n, g in stock["grads"].items()}
    grads_c = {n: torch.tensor(g) for n, g in chunked["grads"].items()}
    assert grads_s.keys() == grads_c.keys() and len(grads_s) > 5
    scale = sum(float(g.norm() ** 2) for g in grads_s.values()) ** 0.5
    assert scale > 0
    for name, grad in grads_s.items():
        assert float((grads_c[name] - grad).norm()) / scale < 1e-5, name
