"""Schedule-Free AdamW under DeepSpeed ZeRO-1/2/3 (real engines, 2 gloo ranks on CPU).

``tests/helpers/schedulefree_zero_worker.py`` trains a small MLP through ``schedule_free`` as the RPG
policy actor does (train mode for each fit, eval mode after it) and records what DeepSpeed holds,
under the worst timing DeepSpeed's async all-gathers may legally have and the CPU backend's fix for it
(seam ``zero3_gather``). Checked against values computed here: ``k`` = the optimizer steps and
``weight_sum`` / ``lr_max`` of the warm-up formula (ZeRO-3 used to advance them once per sub-group
call); the model's weights equal the master copy after each switch, and the switch moved them:
y = beta1 x + (1 - beta1) z (ZeRO-3 used to switch nothing); in fp32, x and y equal upstream
``schedulefree.AdamWScheduleFree`` on plain parameters with the same data.
"""

from __future__ import annotations

import json

import pytest
import schedulefree_zero_worker as worker
import torch

CASES = ["1:fp32", "2:bf16", "3:fp32"]  # ZeRO-3 bf16: tests/test_e2e_ranks.py's ZeRO-3 run


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    from deepspeed_ranks import run_script

    out = tmp_path_factory.mktemp("sf_zero") / "records.json"
    run_script("schedulefree_zero_worker.py", str(out), *CASES, timeout=900)
    return json.loads(out.read_text())


def upstream_trajectory() -> list[dict[str, torch.Tensor]]:
    """x after each fit and y at the start of the next, from upstream Schedule-Free on plain params."""
    from schedulefree import AdamWScheduleFree

    model, x, y = worker.model_and_data()
    opt = AdamWScheduleFree(
        worker.param_groups(model), lr=worker.LR, betas=worker.BETAS, eps=worker.EPS,
        weight_decay=worker.WD, warmup_steps=worker.WARMUP,
    )  # fmt: skip
    points = []

    def record(mode: str) -> None:
        points.append(
            {"mode": mode, **{n: p.detach().clone().flatten() for n, p in model.named_parameters()}}
        )

    for n_steps in worker.FITS:
        opt.train()
        record("train")
        for _ in range(n_steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        opt.eval()
        record("eval")
    return points


def expected_scalars(steps: int) -> dict[str, float]:
    """Schedule-Free's step scalars after ``steps`` steps: linear warm-up over WARMUP steps,
    weight_i = lr_max_i ** 2 (r = 0, weight_lr_power = 2), lr_max non-decreasing."""
    lrs = [worker.LR * min(1.0, (i + 1) / worker.WARMUP) for i in range(steps)]
    return {"k": float(steps), "weight_sum": sum(lr**2 for lr in lrs), "lr_max": lrs[-1] if lrs else -1.0}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_one_k_per_step_and_x_y_switch(results: dict, case: str) -> None:
    records = results[case]
    steps_after_fit = [sum(worker.FITS[: i + 1]) for i in range(len(worker.FITS))]
    assert [r["steps"] for r in records if r["mode"] == "eval"] == steps_after_fit
    beta1 = worker.BETAS[0]
    dtype = torch.bfloat16 if case.endswith("bf16") else torch.float32
    done = 0
    for rec in records:
        if rec["mode"] == "eval":
            done = rec["steps"]
        assert rec["train_mode"] == (rec["mode"] == "train")
        for group in rec["groups"]:  # both parameter groups: one increment per optimizer step
            want = expected_scalars(done)
            assert group["k"] == want["k"], (case, rec["mode"], done, group)
            assert group["weight_sum"] == pytest.approx(want["weight_sum"], rel=1e-12)
            assert group["lr_max"] == pytest.approx(want["lr_max"], rel=1e-12)
        for name, master in rec["master"].items():  # the model's weights follow the master copy
            expected = torch.tensor(master).to(dtype).float()
            assert torch.equal(torch.tensor(rec["model"][name]), expected), (case, rec["mode"], name)
    # The switch moves the weights between x and y: y = beta1 x + (1 - beta1) z, with x != y, on
    # every rank's master partitions (z is the optimizer state of the same flat tensor).
    for before, after in zip(records[1::2], records[2::2]):  # eval (x) then the next train (y)
        moved = 0.0
        for rank_before, rank_after in zip(before["flats"], after["flats"]):
            for flat_x, flat_y in zip(rank_before, rank_after):
                x = torch.tensor(flat_x["x_or_y"], dtype=torch.float64)
                y = torch.tensor(flat_y["x_or_y"], dtype=torch.float64)
                z = torch.tensor(flat_x["z"], dtype=torch.float64)
                torch.testing.assert_close(y, beta1 * x + (1 - beta1) * z, rtol=0, atol=2e-7)
                moved = max(moved, (y - x).abs().max().item())
        assert moved > 1e-4, (case, moved)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c.endswith("fp32")])
def test_fp32_trajectory_equals_upstream_schedulefree(results: dict, case: str) -> None:
    reference = upstream_trajectory()
    records = results[case]
    assert [r["mode"] for r in records] == [p["mode"] for p in reference]
    for rec, ref in zip(records, reference):
        for name, master in rec["master"].items():
            torch.testing.assert_close(torch.tensor(master), ref[name], rtol=1e-5, atol=1e-6)
