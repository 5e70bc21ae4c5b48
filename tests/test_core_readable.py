"""The loss source reads like the paper (issues #27, #48): every registered (divergence, style) of the
paper is one function defined by name in the source with its formula in its docstring (a
divergence's loss: its style's function applied to kl.DIVERGENCES[name], the paper's Tables 1 and 2),
gradients come from autograd (no torch.autograd.Function but the chunked log-probs'), and no loss
writes into a tensor it was given."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
import torch
from test_core_losses import random_batch

from rpg_openrlhf.core import LOSS_NAMES, LOSSES, STYLES, LossConfig
from rpg_openrlhf.core.kl import DIVERGENCES
from rpg_openrlhf.core.losses import _build_terms

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "rpg_openrlhf" / "core"
PAPER = sorted(k for k in LOSSES if k[0] in LOSS_NAMES and k[1] in STYLES)


def _versions(*tensors: object) -> list[int]:
    return [x._version for x in tensors if isinstance(x, torch.Tensor)]


@pytest.mark.parametrize("key", sorted(LOSSES), ids="/".join)
@pytest.mark.parametrize("with_ref", [True, False])
def test_no_loss_writes_into_what_it_was_given(key, with_ref):
    x = random_batch(seed=0, b=3, t=6, spread=0.8)
    cfg = LossConfig(beta=0.3, clip_c=3.0, kl_value_clamp=0.5 if key[1] == "differentiable" else None)
    t = _build_terms(key[0], x["logp"], x["old_logp"], x["advantages"], x["action_mask"],
                     x["ref_logp"] if with_ref else None, cfg)  # fmt: skip
    given = (t.logp, t.log_w, t.w, t.log_rho, t.rho, t.adv, t.mask)
    before = _versions(*given)
    LOSSES[key](t)
    assert _versions(*given) == before


def test_no_autograd_function_but_the_chunked_log_probs():
    """A hand-written backward stays only where a step-level benchmark keeps it (docs/losses.md)."""
    found = {
        (path.name, node.name)
        for path in CORE.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(b).endswith("autograd.Function") for b in node.bases)
    }
    assert found == {("logprobs.py", "_ChunkedLogProbs")}
    text = (REPO / "docs" / "losses.md").read_text()
    assert "_ChunkedLogProbs" in text and "0.029x" in text  # docs/losses.md names it with its figure


def test_docs_tables_link_every_loss_to_the_function_of_its_formula():
    """docs/losses.md's divergence, style and GRPO tables link each name to a file of the core that
    defines it: the style's (or GRPO loss's) function, or the divergence's DIVERGENCES entry."""
    text = (REPO / "docs" / "losses.md").read_text()
    links = dict(re.findall(r"^\| \[`(\w+)`\]\(\.\./(rpg_openrlhf/core/\w+\.py)\)", text, re.M))
    for key in PAPER:
        fn = LOSSES[key]
        linked = key[1] if isinstance(fn, functools.partial) else key[0]  # a divergence's loss: its style's
        assert linked in links, f"{key}: docs/losses.md's tables do not link {linked!r}"
        source = ast.parse((REPO / links[linked]).read_text())
        defined = {n.name for n in source.body if isinstance(n, ast.FunctionDef)}
        assert getattr(fn, "func", fn).__name__ == linked and linked in defined, (key, links[linked])
    for div in DIVERGENCES:
        assert links.get(div) == "rpg_openrlhf/core/kl.py", div
