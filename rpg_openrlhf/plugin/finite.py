"""Non-finite loss inputs: every data-parallel rank stops with the same error, none waits.

``core.compute_loss`` raises ``ValueError`` on a NaN/inf input. Under data parallelism that
raise happens on the rank that saw the bad value only, while the other ranks go on into
DeepSpeed's gradient collectives and wait there for it: a hang, not an error (a Ray actor
whose method raised stays alive, so the collective never fails either).

:func:`agree_finite` runs before the loss on every rank: each rank writes its own row of a
``[world, n_inputs]`` table of "non-finite" flags, one ``all_reduce(SUM)`` over the group
gives every rank the whole table, and if any entry is set every rank raises the same
:class:`NonFiniteInputError` naming the ranks and inputs. Policy: stop, not skip (a silently
skipped step would hide a broken rollout or reference model).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist


class NonFiniteInputError(ValueError):
    """A loss input holds NaN or inf on at least one data-parallel rank (same text on every rank)."""


def _world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def nonfinite_flags(inputs: Mapping[str, torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """One float per input: 1.0 when any entry is NaN or +-inf (``None`` inputs count as finite).

    aminmax propagates NaN and inf, so one reduction pass per input decides it (no [B, T] copies).
    """
    flags = [
        torch.zeros((), device=device)
        if x is None
        else (~torch.isfinite(torch.stack(torch.aminmax(x.detach())))).any().float().to(device)
        for x in inputs.values()
    ]
    return torch.stack(flags)


def agree_finite(
    inputs: Mapping[str, torch.Tensor | None],
    where: str = "RPG loss",
    group: dist.ProcessGroup | None = None,
) -> None:
    """Raise :class:`NonFiniteInputError` on every rank of ``group`` if any rank has a non-finite input.

    Collective: every rank of ``group`` must call it the same number of times (one call per
    micro-batch, like the backward that follows). Without an initialized process group it is a
    local check.
    """
    first = next((x for x in inputs.values() if x is not None), None)
    device = first.device if first is not None else torch.device("cpu")
    rank, world = _world(group)
    table = torch.zeros(world, len(inputs), device=device)
    table[rank] = nonfinite_flags(inputs, device)
    if world > 1:
        dist.all_reduce(table, op=dist.ReduceOp.SUM, group=group)
    bad = table.cpu() > 0
    if not bool(bad.any()):
        return
    names = list(inputs)
    per_rank = [
        f"rank {r}: {', '.join(names[i] for i in range(len(names)) if bad[r, i])}"
        for r in range(world)
        if bool(bad[r].any())
    ]
    raise NonFiniteInputError(
        f"{where}: NaN or inf in the inputs ({'; '.join(per_rank)}); all {world} data-parallel "
        "rank(s) stop here with this error"
    )
