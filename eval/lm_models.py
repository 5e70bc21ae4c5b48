"""lm-eval model backends with per-problem deterministic sampling (hf: registered as "rpg-hf"; vllm).

lm-eval hands a model the k repeats of a problem as k references to one Instance.  We
generate those k samples together from a seed derived from (seed, benchmark, problem id),
so a problem's samples do not depend on which other problems are in the run: an
interrupted run that regenerates only its missing problems ends with exactly the
records of an uninterrupted one (hf backend; vLLM is deterministic per request seed up to
its own kernels).
"""

from __future__ import annotations

import hashlib
from typing import Any

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM


def problem_seed(seed: int, doc: dict) -> int:
    """A 31-bit seed for one problem, stable across runs and processes."""
    key = f"{seed}:{doc.get('benchmark', '')}:{doc.get('id', '')}:{doc.get('problem', '')}"
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def _group_repeats(requests: list) -> list[list[int]]:
    """Positions of each distinct Instance (its k repeats), in first-seen order."""
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault(id(r), []).append(i)
    return list(groups.values())


@register_model("rpg-hf")
class RPGHFLM(HFLM):
    """HFLM whose samples are seeded per problem (batch_size should be >= n)."""

    def __init__(self, *args: Any, sample_seed: int = 0, progress: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sample_seed = int(sample_seed)
        self.progress = progress  # optional callable(n_done_problems) for an outer tqdm

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        import torch

        out: list[str | None] = [None] * len(requests)
        for positions in _group_repeats(requests):
            first = requests[positions[0]]
            torch.manual_seed(problem_seed(self.sample_seed, first.doc))
            res = super().generate_until([requests[i] for i in positions], disable_tqdm=True)
            for i, s in zip(positions, res):
                out[i] = s
            if self.progress:
                self.progress(1)
        return out  # type: ignore[return-value]


class RPGVLLM:  # pragma: no cover - needs a GPU and vLLM
    """vLLM backend: one request per problem with n = k and a per-problem seed.

    Built lazily so that importing this module never needs vLLM.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        from lm_eval.models.vllm_causallms import VLLM

        class _RPGVLLM(VLLM):
            def __init__(self, *a: Any, sample_seed: int = 0, progress: Any = None, **kw: Any) -> None:
                super().__init__(*a, **kw)
                self.sample_seed = int(sample_seed)
                self.progress = progress

            def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
                from vllm import SamplingParams

                groups = _group_repeats(requests)
                prompts, params = [], []
                for positions in groups:
                    req = requests[positions[0]]
                    context, gen = req.args[0], dict(req.args[1])
                    top_k = int(gen.get("top_k", 0) or 0)
                    params.append(
                        SamplingParams(
                            n=len(positions),
                            seed=problem_seed(self.sample_seed, req.doc),
                            temperature=float(gen.get("temperature", 1.0)),
                            top_p=float(gen.get("top_p", 1.0)),
                            top_k=top_k if top_k > 0 else -1,
                            max_tokens=int(gen.get("max_gen_toks", self.max_gen_toks)),
                            stop=list(gen.get("until") or []) or None,
                        )
                    )
                    prompts.append(context)
                outputs = self.model.generate(prompts, params, use_tqdm=not disable_tqdm)
                res: list[str | None] = [None] * len(requests)
                for positions, o in zip(groups, outputs):
                    for i, comp in zip(positions, o.outputs):
                        res[i] = comp.text
                if self.progress:
                    self.progress(len(groups))
                return res  # type: ignore[return-value]

        return _RPGVLLM(*args, **kwargs)


def make_lm(
    backend: str, model_path: str, n: int, seed: int, max_tokens: int, progress: Any = None, **extra: Any
):
    """An lm-eval LM for one checkpoint: backend "hf" (CPU or GPU) or "vllm"."""
    if backend == "hf":
        return RPGHFLM(
            pretrained=model_path,
            batch_size=n,
            sample_seed=seed,
            progress=progress,
            max_length=extra.pop("max_length", None),
            **extra,
        )
    if backend == "vllm":
        return RPGVLLM(
            pretrained=model_path,
            sample_seed=seed,
            progress=progress,
            max_gen_toks=max_tokens,
            seed=seed,
            **extra,
        )
    raise ValueError(f"backend must be 'hf' or 'vllm', got {backend!r}")
