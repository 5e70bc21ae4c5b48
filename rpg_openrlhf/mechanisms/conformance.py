"""Experiment 6, conformance (issue 39): every framework's KL option measured by running that
framework's own code, as installed, on the enumerable policy; each against its registered --rpg.loss.

For each upstream option (OPTIONS) and each case (weight level token / sequence, pi_ref = pi_old or a
fixed pi_ref, KL(pi_old || pi_theta) = 0, 0.01, 0.1, 0.5, advantages 0 or R - mean R):
  * the framework's loss on all N = 256 sequences (every token unmasked, beta = 1), differentiated
    w.r.t. each entry's log-prob (or, for TRL, each entry's logits: upstream_trl.py) and weighted by
    pi_old: the exact expected gradient E_old[grad L] over all sequences, w.r.t. the logit table;
  * the same from the registered option (experiments.exact_loss), and their relative distance
    ||g_upstream - g_registered|| / max(||g_registered||, S), S = ||grad RKL|| on-policy at token level
    with the fixed pi_ref (a case-independent scale where both gradients vanish);
  * with advantages 0, its distance to every divergence's exact gradient (atlas.distances): which
    divergence the framework's own code descends.
Sequence level: the same functions given one entry per sequence (its summed log-probs), as the core's
weight_level "sequence". slime, NeMo-RL and DeepSeek-V3.2 are not on PyPI: their rows are the
registered re-implementation itself, marked as such.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from torch import Tensor

from rpg_openrlhf.core import LossConfig, token_losses

from . import atlas as A
from . import toy as T
from . import upstream as U
from . import upstream_trl

BETA = 1.0
EPS_LOW, EPS_HIGH = 0.2, 0.28
VERL_CLIP_C = 3.0  # verl's clip_ratio_c default: its PPO is always dual-clip
AGREE = 1e-12  # float64 on both sides
AGREE_FLOAT32 = 1e-5  # where upstream computes in float32 (the reason is in the row)
LEVELS = ("token", "sequence")
REFS = ("pi_old", "fixed")
FLOAT32_OPENRLHF = "float32: compute_approx_kl casts the log-probs with .float()"
FLOAT32_TRL = (
    "float32: TRL's fused LM head computes the log-probs in float32 (trl/kernels/chunked_logprob.py)"
)


@dataclass(frozen=True)
class Option:
    """One framework option: its framework, its own name for it, the registered --rpg.loss it must
    equal, the functions the conformance calls, the driver's settings and the arithmetic it runs in."""

    framework: str
    name: str
    loss: str
    calls: str = ""  # "": a re-implementation (the framework is not installable from PyPI)
    settings: dict = field(default_factory=dict)
    float32: str = ""  # why upstream computes in float32 ("": float64 throughout)
    source: str = ""  # a re-implementation's source (repository @ snapshot or paper)


_OPENRLHF_LOSS = "PolicyLoss, compute_approx_kl, aggregate_loss (as ActorPPOTrainer.training_step adds them)"
_OPENRLHF_REWARD = ("compute_approx_kl (as make_experience), RemoteExperienceMaker.compute_advantages_and_returns "
                    "(compute_reward, get_cumulative_returns), PolicyLoss")  # fmt: skip
_VERL = "verl.workers.utils.losses.ppo_loss (core_algos.compute_policy_loss_vanilla, kl_penalty, agg_loss)"
_TRL = "GRPOTrainer (its constructor), GRPOTrainer.compute_loss (_compute_loss) through TRL's fused LM head"

OPTIONS: tuple[Option, ...] = (
    *(Option("OpenRLHF", f"--algo.kl.use_loss --algo.kl.estimator {k}", f"openrlhf_{k}_loss", _OPENRLHF_LOSS,
             {"estimator": k}, FLOAT32_OPENRLHF) for k in ("k1", "k2", "k3")),
    Option("OpenRLHF", "--algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.unbiased_gradient",
           "openrlhf_k3_unbiased_gradient", _OPENRLHF_LOSS, {"estimator": "k3", "unbiased": True}, FLOAT32_OPENRLHF),
    *(Option("OpenRLHF", f"--algo.kl.estimator {k} (KL in the reward)", f"openrlhf_{k}_reward", _OPENRLHF_REWARD,
             {"estimator": k, "in_reward": True}, FLOAT32_OPENRLHF) for k in ("k1", "k2", "k3")),
    *(Option("verl", f"use_kl_loss, kl_loss_type={k}", loss, _VERL, {"kl_loss_type": k})
      for k, loss in (("k1", "verl_k1"), ("k2", "verl_k2"), ("abs", "verl_abs"), ("low_var_kl", "verl_low_var_kl"),
                      ("k3+", "verl_k3plus"), ("k1+", "verl_k3plus"), ("abs+", "verl_k3plus"))),
    Option("TRL", "beta > 0, use_bias_correction_kl=False", "trl_k3", _TRL, {"use_bias_correction_kl": False},
           FLOAT32_TRL),
    Option("TRL", "beta > 0, use_bias_correction_kl=True (the default)", "trl_k3_bias_corrected", _TRL,
           {"use_bias_correction_kl": True}, FLOAT32_TRL),
    Option("slime", "--use-kl-loss --kl-loss-type k3 --use-unbiased-kl", "slime_k3_unbiased",
           source="THUDM/slime slime/utils/ppo_utils.py compute_approx_kl(importance_ratio=...)"),
    Option("slime", "--use-kl-loss --kl-loss-type k1 --use-unbiased-kl", "slime_k1_unbiased",
           source="THUDM/slime slime/utils/ppo_utils.py compute_approx_kl(importance_ratio=...)"),
    Option("NeMo-RL", "use_on_policy_kl_approximation: false", "nemo_rl_k3",
           source="NVIDIA-NeMo/RL nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn, calculate_kl"),
    Option("NeMo-RL", "use_on_policy_kl_approximation: true", "nemo_rl_k3_on_policy",
           source="NVIDIA-NeMo/RL nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn, calculate_kl"),
    Option("DeepSeek-V3.2", "k3 times pi_theta/pi_old (arXiv 2512.02556, Sec. 3.1)", "deepseek_v32_k3",
           source="the formula as TRL PR #4638 and slime PR #1004 state it"),
)  # fmt: skip
UPSTREAM_FRAMEWORKS = ("OpenRLHF", "verl", "TRL")  # installed by `make setup`: run from their own code
REIMPLEMENTATION = "re-implementation"  # the version column of a framework not installable from PyPI


@dataclass
class Case:
    """One condition: weight level, reference, drift, advantages, and the logit tables."""

    level: str
    ref: str  # "pi_old" | "fixed"
    kl: float  # KL(pi_old || pi_theta)
    adv: str  # "0" | "R - mean R"
    theta: Tensor
    old: Tensor
    ref_logits: Tensor | None  # None: pi_ref = pi_old
    advantages: Tensor  # [N]


def cases(toy: T.Toy, kl_targets: tuple[float, ...]) -> list[Case]:
    """Every condition, on atlas.policies' pi_old, fixed pi_ref and drifted pi_theta."""
    old, fixed_ref, thetas = A.policies(toy, kl_targets)
    advs = {"0": torch.zeros(toy.num_seqs, dtype=T.DTYPE), "R - mean R": toy.reward - toy.reward.mean()}
    return [Case(level, ref, kl, adv, theta, old, None if ref == "pi_old" else fixed_ref, a)
            for level in LEVELS for ref in REFS for kl, (_, theta) in thetas.items() for adv, a in advs.items()]  # fmt: skip


# ---------------------------------------------------------------------------------------- exact expectations
def entry_logp(toy: T.Toy, logits: Tensor, level: str) -> Tensor:
    """Log-probs of every entry [N, T]: per token, or one entry per sequence (its sum) [N, 1]."""
    lp = T.token_logp(toy, logits)
    return lp if level == "token" else lp.sum(-1, keepdim=True)


def _pi_old(toy: T.Toy, case: Case) -> Tensor:
    return T.seq_logp(toy, case.old).exp()


def expected_from_entries(toy: T.Toy, case: Case, per_entry: Tensor) -> Tensor:
    """sum_i pi_old(x_i) sum_t per_entry[i, t] grad log pi_theta(entry i, t): the exact expected gradient
    of a per-entry loss whose derivative w.r.t. each entry's log-prob is per_entry [N, T]."""
    x = case.theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(entry_logp(toy, x, case.level), x, _pi_old(toy, case)[:, None] * per_entry)
    return g


def _inputs(lp: Tensor, old: Tensor, ref: Tensor, adv: Tensor) -> SimpleNamespace:
    """The framework's inputs: a leaf of the entries' log-probs, old and reference log-probs, per-entry
    advantages (adv [N]: one per sequence), an all-ones mask (every entry counts, so a token mean is the
    sum over N x T entries)."""
    lp = lp.detach().requires_grad_(True)
    return SimpleNamespace(lp=lp, old=old, ref=ref, adv=adv[:, None].expand_as(lp).contiguous(),
                           mask=torch.ones_like(lp, dtype=torch.bool), count=lp.numel())  # fmt: skip


def _through_entries(toy: T.Toy, case: Case, loss_of: Callable[[SimpleNamespace], Tensor]) -> Tensor:
    """The exact expected gradient of a framework loss that averages per-entry losses over all entries."""
    old = entry_logp(toy, case.old, case.level)
    ref = old if case.ref_logits is None else entry_logp(toy, case.ref_logits, case.level)
    x = _inputs(entry_logp(toy, case.theta, case.level), old, ref, case.advantages)
    (g,) = torch.autograd.grad(loss_of(x), x.lp)
    return expected_from_entries(toy, case, g * x.count)


def _registered_loss(option: Option, lp: Tensor, old: Tensor, adv: Tensor, ref, level="token") -> Tensor:
    """The registered option's per-entry losses (core token_losses), summed over every unmasked entry."""
    clip_c = VERL_CLIP_C if option.framework == "verl" else None
    cfg = LossConfig(beta=BETA, weight_level=level, eps_low=EPS_LOW, eps_high=EPS_HIGH, clip_c=clip_c)
    loss, mask, _ = token_losses(option.loss, "differentiable", lp, old, adv, None, ref, cfg)
    return (loss * mask).sum()


def registered(toy: T.Toy, option: Option, case: Case) -> Tensor:
    """The registered option's exact expected gradient, through the upstream code's pipeline: the core's
    per-entry gradient (token_losses summed, w.r.t. the token log-probs), then expected_from_entries."""
    lp = T.token_logp(toy, case.theta).detach().requires_grad_(True)
    old = T.token_logp(toy, case.old).detach()
    ref = None if case.ref_logits is None else T.token_logp(toy, case.ref_logits).detach()
    (g,) = torch.autograd.grad(_registered_loss(option, lp, old, case.advantages, ref, case.level), lp)
    return expected_from_entries(toy, case, g if case.level == "token" else g[:, :1])  # a sequence: one entry


# ---------------------------------------------------------------------------------------- the frameworks' code
def _openrlhf_policy_loss(o: SimpleNamespace, x: SimpleNamespace, advantages: Tensor) -> Tensor:
    actor_loss, *_ = o.PolicyLoss(clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH)(
        x.lp, x.old, advantages, action_mask=x.mask
    )
    return actor_loss


def _openrlhf_kl_loss(o: SimpleNamespace, option: Option, x: SimpleNamespace) -> Tensor:
    """ActorPPOTrainer.training_step with --algo.kl.use_loss: actor_loss + aggregate_loss(kl) * kl_ctl."""
    kl = o.compute_approx_kl(x.lp, x.ref, log_probs_old=x.old, kl_estimator=option.settings["estimator"],
                             unbiased_gradient=option.settings.get("unbiased", False))  # fmt: skip
    return _openrlhf_policy_loss(o, x, x.adv) + o.aggregate_loss(kl, x.mask) * BETA


def _openrlhf_kl_in_reward(o: SimpleNamespace, option: Option, x: SimpleNamespace) -> Tensor:
    """make_experience's kl (pi_old against pi_ref), then the experience maker's own
    compute_advantages_and_returns (dr_grpo: one group of all N sequences, whose advantages already
    have mean 0, so the baseline leaves them as given; returns-to-go, gamma 1), then PolicyLoss."""
    n = x.lp.shape[0]
    kl = o.compute_approx_kl(x.old, x.ref, kl_estimator=option.settings["estimator"])
    experience = o.Experience(rewards=x.adv[:, 0].clone(), kl=kl, action_mask=x.mask, index=list(range(n)))
    args = SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=n), reward=SimpleNamespace(clip_range=None),
                           algo=SimpleNamespace(advantage=SimpleNamespace(estimator="dr_grpo", gamma=1.0)))  # fmt: skip
    maker = object.__new__(o.RemoteExperienceMaker)  # the fields compute_advantages_and_returns reads
    maker.strategy, maker.args, maker.advantage_estimator = SimpleNamespace(args=args), args, "dr_grpo"
    maker.kl_ctl = o.FixedKLController(BETA)
    o.RemoteExperienceMaker.compute_advantages_and_returns(maker, [experience])
    return _openrlhf_policy_loss(o, x, experience.advantages)


def _verl_loss(v: SimpleNamespace, option: Option, x: SimpleNamespace) -> Tensor:
    """verl's actor loss, ppo_loss(config, model_output, data): the log-probs in its no-padding layout
    (per sequence: the response's log-probs, then the prompt position's), the batch as a TensorDict."""
    n, t = x.lp.shape
    cfg = v.ActorConfig(strategy="fsdp", ppo_mini_batch_size=n, ppo_micro_batch_size_per_gpu=n, rollout_n=1,
                        use_kl_loss=True, kl_loss_type=option.settings["kl_loss_type"], kl_loss_coef=BETA,
                        clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH, clip_ratio_c=VERL_CLIP_C)  # fmt: skip
    long = {"dtype": torch.long}
    data = v.TensorDict({"prompts": torch.zeros(n, 1, **long), "responses": torch.zeros(n, t, **long),
                         "attention_mask": torch.ones(n, 1 + t, **long), "response_mask": torch.ones(n, t, **long),
                         "old_log_probs": x.old, "advantages": x.adv, "ref_log_prob": x.ref}, batch_size=[n])  # fmt: skip
    v.tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=n * t, global_batch_size=n)
    flat = torch.cat([x.lp, x.lp.new_zeros(n, 1)], dim=1).reshape(-1)
    loss, _ = v.ppo_loss(cfg, {"log_probs": flat}, data)
    return loss


def _trl_expected(trainer, toy: T.Toy, case: Case) -> Tensor:
    """The exact expected gradient of GRPOTrainer.compute_loss (upstream_trl.entry_gradients)."""
    n, x = toy.num_seqs, case.theta.detach().clone().requires_grad_(True)
    old = entry_logp(toy, case.old, case.level)
    ref = old if case.ref_logits is None else entry_logp(toy, case.ref_logits, case.level)
    if case.level == "token":
        out, seqs = x[toy.prefix_idx], toy.seqs  # each entry's logits [N, L, V]
    else:  # one token per sequence over a vocabulary of all N sequences; every entry's logits = log pi_theta
        out, seqs = T.seq_logp(toy, x)[None, None, :].expand(n, 1, n), torch.arange(n)[:, None]
    grads = upstream_trl.entry_gradients(trainer, out.detach(), seqs, old, ref, case.advantages)
    weighted = _pi_old(toy, case)[:, None, None] * grads * old.numel()
    (g,) = torch.autograd.grad(out, x, weighted)
    return g


class Runner:
    """The upstream code of every installed framework, loaded once; expected_grad(option, case)."""

    def __init__(self, toy: T.Toy, stack) -> None:
        self.toy, self.stack, self._trainers = toy, stack, {}
        self.openrlhf, self.verl, self.trl = U.openrlhf(), U.verl(), U.trl()

    def trained(self, option: Option, level: str):
        key = (option.settings["use_bias_correction_kl"], level)
        if key not in self._trainers:
            vocab, length = (self.toy.vocab, self.toy.length) if level == "token" else (self.toy.num_seqs, 1)
            self._trainers[key] = self.stack.enter_context(upstream_trl.grpo_trainer(
                self.trl, vocab, length, self.toy.num_seqs, beta=BETA, epsilon=EPS_LOW, epsilon_high=EPS_HIGH,
                use_bias_correction_kl=key[0]))  # fmt: skip
        return self._trainers[key]

    def loss_of(self, option: Option) -> Callable[[SimpleNamespace], Tensor]:
        """The framework's loss of _inputs(...) (OpenRLHF, verl)."""
        if option.framework == "verl":
            return lambda x: _verl_loss(self.verl, option, x)
        if option.settings.get("in_reward"):
            return lambda x: _openrlhf_kl_in_reward(self.openrlhf, option, x)
        return lambda x: _openrlhf_kl_loss(self.openrlhf, option, x)

    def expected_grad(self, option: Option, case: Case) -> Tensor:
        if option.framework == "TRL":
            return _trl_expected(self.trained(option, case.level), self.toy, case)
        return _through_entries(self.toy, case, self.loss_of(option))


# ---------------------------------------------------------------------------------------- extreme log-ratios
EXTREME = 1e-4  # per entry, at extreme log-ratios (float32 upstream: its rounding of e^|l|-sized terms)
EXTREME_L = (-8.0, 25.0)  # l of extreme_batch: upstream's own arithmetic keeps its digits there
DEEP_L = (-25.0, -8.0)  # l where TRL's float32 autograd of w k3 cancels: measured, not held to EXTREME


def logits_logp(toy: T.Toy, logits: Tensor) -> Tensor:
    return logits.log_softmax(-1).gather(-1, toy.seqs[..., None]).squeeze(-1)


def extreme_batch(toy: T.Toy, l_range: tuple[float, float] = EXTREME_L, seed: int = 7) -> SimpleNamespace:
    """Every entry of the N sequences with logits of its own, log(pi_theta/pi_old) across (-24, 24) and
    l = log(pi_theta/pi_ref) across l_range, independently, so log(pi_ref/pi_old) passes +-20: the core's
    own log-ratio clamp, which no framework has in its KL (issue 39). Each sampled token's logit sits
    below the largest other one (p <= 0.33), so a float32 1 - p keeps its digits in TRL's LM head;
    l >= -8 by default: below, TRL's own autograd of w k3 in float32 loses its digits (its two gradient
    terms, each ~ w e^-l, cancel). Advantages 0: the KL part."""
    g = torch.Generator().manual_seed(seed)
    n, length, vocab = toy.num_seqs, toy.length, toy.vocab

    def spread(lo: float, hi: float) -> Tensor:
        return torch.linspace(lo, hi, n * length, dtype=T.DTYPE)[torch.randperm(n * length, generator=g)]

    logits = 4.0 * torch.randn(n, length, vocab, generator=g, dtype=T.DTYPE)
    others = logits.scatter(-1, toy.seqs[..., None], -math.inf).amax(-1)
    sampled = others - 0.7 - 4.0 * torch.randn(n, length, generator=g, dtype=T.DTYPE).abs()
    logits = logits.scatter(-1, toy.seqs[..., None], sampled[..., None])
    lp = logits_logp(toy, logits)
    old, ref = lp - spread(-24.0, 24.0).reshape(n, length), lp - spread(*l_range).reshape(n, length)
    return SimpleNamespace(logits=logits, old=old, ref=ref, adv=torch.zeros(n, dtype=T.DTYPE))


def extreme_agreement(runner: Runner, option: Option, batch: SimpleNamespace) -> float:
    """max over entries of |g_upstream - g_registered| / (|g_registered| + 1e-8 max |g_registered|), the
    per-entry gradients w.r.t. each entry's logits of the two losses (token level) on extreme_batch."""
    toy, count = runner.toy, batch.old.numel()
    x = batch.logits.clone().requires_grad_(True)
    (reg,) = torch.autograd.grad(
        _registered_loss(option, logits_logp(toy, x), batch.old, batch.adv, batch.ref), x
    )
    if option.framework == "TRL":
        up = upstream_trl.entry_gradients(runner.trained(option, "token"), batch.logits, toy.seqs, batch.old,
                                          batch.ref, batch.adv) * count  # fmt: skip
    else:
        lp = logits_logp(toy, x)
        inputs = _inputs(lp, batch.old, batch.ref, batch.adv)
        (g,) = torch.autograd.grad(runner.loss_of(option)(inputs), inputs.lp)
        (up,) = torch.autograd.grad(lp, x, g * count)
    diff = (up - reg).abs()
    return float(torch.where(diff == 0, 0.0, diff / (reg.abs() + 1e-8 * reg.abs().max())).max())


# ---------------------------------------------------------------------------------------- rows
def versions() -> dict[str, str | None]:
    """framework -> installed version (None: not installed), for the frameworks run from their code."""
    return {f: U.version_of(f) for f in UPSTREAM_FRAMEWORKS}


def require_frameworks() -> dict[str, str]:
    """The installed versions, or SystemExit naming what is missing and how to install it."""
    installed = versions()
    missing = [f for f, v in installed.items() if v is None]
    if missing:
        raise SystemExit(
            f"conformance: {', '.join(missing)} not installed; `make setup` installs them with --no-deps into "
            f"{U.CONFORMANCE_DIR} (requirements/conformance.txt); nothing was written"
        )
    return installed


def measure(toy: T.Toy, kl_targets: tuple[float, ...] = A.KL_TARGETS) -> list[dict]:
    """One row per (option, case): the upstream code's exact expected gradient against the registered
    option's (agreement) and, with advantages 0, against every divergence's (atlas.distances)."""
    installed = versions()
    all_cases = cases(toy, kl_targets)
    on = next(c for c in all_cases if c.level == "token" and c.ref == "fixed" and c.kl == 0 and c.adv == "0")
    scale = float(A.divergence_grads(toy, "token", on.theta, on.old, on.ref_logits)["rkl"].norm())
    rows = []
    with contextlib.ExitStack() as stack:
        runner = Runner(toy, stack)
        batches = {"extreme": extreme_batch(toy), "extreme, l < -8": extreme_batch(toy, DEEP_L)}
        for option in (o for o in OPTIONS if o.calls):
            for name, batch in batches.items():
                rows.append({"framework": option.framework, "version": installed[option.framework],
                             "option": option.name, "loss": option.loss, "level": "token", "ref": name,
                             "kl_old_theta": math.nan, "advantages": "0",
                             "agreement": extreme_agreement(runner, option, batch)})  # fmt: skip
        for case in all_cases:
            ref = case.old if case.ref_logits is None else case.ref_logits
            true = A.divergence_grads(toy, case.level, case.theta, case.old, ref) if case.adv == "0" else None
            for option in OPTIONS:
                reg = registered(toy, option, case)
                up = runner.expected_grad(option, case) if option.calls else reg
                agreement = (
                    float((up - reg).norm()) / max(float(reg.norm()), scale) if option.calls else math.nan
                )
                rows.append({"framework": option.framework,
                             "version": installed.get(option.framework) or REIMPLEMENTATION,
                             "option": option.name, "loss": option.loss, "level": case.level, "ref": case.ref,
                             "kl_old_theta": case.kl, "advantages": case.adv, "agreement": agreement,
                             **(A.distances(up, true) if true is not None else {})})  # fmt: skip
    return rows
