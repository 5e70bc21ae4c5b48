"""Peak memory and time of "hidden states -> log-probs -> RPG loss", forward + backward: OpenRLHF's
full-logits path vs the chunked one (``rpg_openrlhf.core.logprobs``), side by side in one run.

    python bench/logprob_memory.py [--vocab 151936 --hidden 256 --tokens 2048 4096 8192]
                                   [--dtype float32] [--repeats 3] [--json OUT]

OpenRLHF 0.11.2 (``Actor.forward``): ``logits = hidden @ W^T`` in the weights' dtype, ``.to(float32)``,
``div_(T)``, ``log_probs_from_logits`` (its own function, imported), the RPG loss (``core.compute_loss``,
urkl / REINFORCE with a reference), backward. Chunked: ``chunked_logprobs(hidden, W, labels)`` at the
default budget, the same loss, backward. Every token is a response token (no prompt tokens to skip,
which only helps the chunked path). Peak: CPU tensor bytes allocated in the region and still alive
(``benchlib.peak_cpu_bytes``; inputs and the weight are made before it and count zero). Time: median of
interleaved rounds (``benchlib.interleaved_times``). The log-probs and every gradient are compared too.

This machine's CPU has no bf16 matrix unit, so the default dtype is float32 and the hidden size 256
(time is dominated by the [N, V] elementwise work at that size; a GPU run uses the real dtype and
hidden size). A size whose projected full-logits peak (linear in N from the smallest size) exceeds
the memory available is skipped and recorded as such, with the projection.
"""

from __future__ import annotations

import argparse
import sys

import torch
from benchlib import (
    environment,
    fmt_table,
    interleaved_times,
    median,
    paired_ratio,
    peak_cpu_bytes,
    write_json,
)

GIB = 2**30


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    a = parser.parse_args(argv)

    import psutil

    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from openrlhf.models.utils import log_probs_from_logits

    from rpg_openrlhf import core
    from rpg_openrlhf.core.logprobs import DEFAULT_BUDGET_BYTES, chunk_tokens_for, chunked_logprobs

    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    weight = (torch.randn(a.vocab, a.hidden) * a.hidden**-0.5).to(dtype).requires_grad_()
    config = core.LossConfig(beta=0.3)

    def loss_of(logp: torch.Tensor, n: int) -> torch.Tensor:
        mask = torch.ones(1, n, dtype=torch.bool)
        old = logp.detach() - 0.05
        ref = logp.detach() + 0.05
        adv = torch.linspace(-1, 1, n)[None]
        return core.compute_loss("urkl", "reinforce", logp, old, adv, mask, ref, config=config)[0]

    def openrlhf_step(hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = torch.nn.functional.linear(hidden, weight)[None].to(torch.float32)  # Actor.forward
        if a.temperature != 1.0:
            logits.div_(a.temperature)
        logp = log_probs_from_logits(logits, labels[None])
        loss_of(logp, hidden.shape[0]).backward()
        return logp.detach()

    def chunked_step(hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logp, _ = chunked_logprobs(hidden, weight, labels, temperature=a.temperature)
        loss_of(logp[None], hidden.shape[0]).backward()
        return logp.detach()[None]

    rows, results, first_peak = [], [], None
    for n in a.tokens:
        hidden = (torch.randn(n, a.hidden)).to(dtype).requires_grad_()
        labels = torch.randint(0, a.vocab, (n,))
        available = psutil.virtual_memory().available
        projected = None if first_peak is None else first_peak[1] * n / first_peak[0]
        if projected is not None and projected > 0.8 * available:
            results.append({"tokens": n, "skipped": f"projected full-logits peak {projected / GIB:.1f} GiB > "
                            f"0.8 x {available / GIB:.1f} GiB available"})  # fmt: skip
            print(f"N={n}: skipped ({results[-1]['skipped']})")
            continue

        def run(step, hidden=hidden, labels=labels):  # one forward + backward; its gradients stay
            hidden.grad = weight.grad = None
            return step(hidden, labels)

        peak = {name: peak_cpu_bytes(lambda s=step: run(s)) for name, step in
                (("openrlhf", openrlhf_step), ("chunked", chunked_step))}  # fmt: skip
        if first_peak is None:
            first_peak = (n, peak["openrlhf"])
        logp_o = run(openrlhf_step)
        grads_o = (hidden.grad.clone(), weight.grad.clone())
        logp_c = run(chunked_step)
        grads_c = (hidden.grad.clone(), weight.grad.clone())
        times = interleaved_times(
            {"openrlhf": lambda: run(openrlhf_step), "chunked": lambda: run(chunked_step)},
            repeats=a.repeats,
            warmup=1,
        )
        rel = [float((c.float() - o.float()).norm() / o.float().norm()) for c, o in zip(grads_c, grads_o)]
        results.append({
            "tokens": n,
            "chunk_tokens": chunk_tokens_for(a.vocab, dtype),
            "peak_bytes": peak,
            "peak_ratio": peak["chunked"] / peak["openrlhf"],
            "seconds": {k: median(v) for k, v in times.items()},
            "time_ratio": paired_ratio(times, "chunked", "openrlhf"),
            "max_abs_logp_diff": float((logp_c - logp_o).abs().max()),
            "grad_rel_err": {"hidden": rel[0], "weight": rel[1]},
        })  # fmt: skip
        r = results[-1]
        rows.append({
            "N": n,
            "OpenRLHF peak GiB": f"{peak['openrlhf'] / GIB:.2f}",
            "chunked peak GiB": f"{peak['chunked'] / GIB:.3f}",
            "peak ratio": f"{r['peak_ratio']:.3f}",
            "OpenRLHF s": f"{r['seconds']['openrlhf']:.2f}",
            "chunked s": f"{r['seconds']['chunked']:.2f}",
            "time ratio": f"{r['time_ratio']:.2f}",
            "max |dlogp|": f"{r['max_abs_logp_diff']:.1e}",
            "grad rel err (h, W)": f"{rel[0]:.1e}, {rel[1]:.1e}",
        })  # fmt: skip
        print(fmt_table(rows[-1:], list(rows[-1])), flush=True)
    print()
    print(f"V={a.vocab} H={a.hidden} {a.dtype} T={a.temperature}; chunk budget "
          f"{DEFAULT_BUDGET_BYTES // 2**20} MiB ({chunk_tokens_for(a.vocab, dtype)} tokens)")  # fmt: skip
    if rows:
        print(fmt_table(rows, list(rows[0])))
    write_json(a.json, {"args": vars(a), "environment": environment(), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
