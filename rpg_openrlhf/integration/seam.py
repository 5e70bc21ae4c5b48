"""The seam to OpenRLHF, DeepSpeed, vLLM, lm-eval, Ray, torch and argparse: every place this project
replaces, temporarily swaps or relies on a private part of a third-party object, in one registry.

Each :class:`Patch` says what is replaced, by what, why, why no extension point of the upstream
can do it, and which upstream function it was checked against: the function's signature and the
source lines the patch depends on (``anchors``) are hashed into ``fingerprint`` (upstream at the
versions of :data:`CHECKED_VERSIONS`). ``tests/test_seam.py`` recomputes every fingerprint from the
installed upstream source, so an upgrade names exactly the patches to re-check; then
``python -m rpg_openrlhf.integration.seam --fingerprints`` prints the new values.

Kinds: ``replace`` (a module or class attribute replaced for the process; applied only through
:func:`apply`, per stage), ``scoped`` (swapped for one call with :func:`swapped`, restored after),
``private`` (a private upstream name read or called, nothing replaced), ``override`` (a subclass
method through an upstream extension point: not a patch, fingerprinted because it depends on the
parent's code). The table in docs/contracts.md is ``python -m rpg_openrlhf.integration.seam --table``.

Stages of :func:`apply`: ``rpg`` (driver, ``--rpg.loss``: the RPG classes), ``budget`` (driver,
stock run with ``--rpg.max_steps``), ``cpu-driver`` / ``cpu-worker`` (CPU backend: driver / every
Ray worker, as post-import hooks, so that a patch waits until its module is imported),
``vllm-engine`` (CPU backend: in each vLLM engine process, when the worker extension is imported).

This module imports nothing heavy (the CPU backend's worker hook runs it in every Ray worker).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

#: Distribution -> the versions every patch below was checked against (rpg-train checks them at
#: start-up: ``rpg_eval.versions.check``; RPG_ALLOW_UNCHECKED_VERSIONS=1 turns the error into a warning).
CHECKED_VERSIONS: dict[str, tuple[str, ...]] = {
    "openrlhf": ("0.11.2",),
    "deepspeed": ("0.19.6",),
    "vllm": ("0.29.0",),
}
#: Versions the fingerprints were taken at, for the packages not checked at start-up.
FINGERPRINTED_AT: dict[str, str] = {
    "openrlhf": "0.11.2",
    "deepspeed": "0.19.6",
    "vllm": "0.29.0",
    "lm_eval": "0.4.13",
    "ray": "2.55.1",
    "torch": "2.13.0",
    "argparse": "python 3.11",
}
KINDS = ("replace", "scoped", "private", "override")
STAGES = ("rpg", "budget", "entropy", "entropy-worker", "cpu-driver", "cpu-worker", "vllm-engine")


@dataclass(frozen=True)
class Patch:
    """One point where this project reaches into a third-party package."""

    key: str
    kind: str  # one of KINDS
    package: str  # distribution the upstream belongs to (a FINGERPRINTED_AT key)
    target: str  # what is replaced / read / overridden
    replacement: str  # what replaces it ("" for private reads)
    why: str
    kept: str  # why no upstream extension point can do it
    upstream: str  # "module:qualname" whose source is fingerprinted ("module:" = the whole module)
    anchors: tuple[str, ...]  # substrings of the upstream lines the patch depends on
    fingerprint: str
    stage: str | None = None  # replace: the apply() stage
    apply: str | None = None  # replace: "module:function(module)" doing it
    hook_module: str | None = None  # replace: the module handed to ``apply`` (imported, or awaited)


# ----------------------------------------------------------------------------- fingerprints
def _source_file(module: str) -> Path:
    """The source file of ``module`` found without importing it or its parent packages."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: finds, imports nothing
    if spec is None or not spec.origin:
        raise LookupError(f"module {module} not found")
    base = Path(spec.origin)
    if not rest:
        return base
    path = base.parent.joinpath(*rest)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise LookupError(f"module {module} not found under {base.parent}")


def upstream_source(upstream: str, origin: str | Path | None = None) -> tuple[str, list[str]]:
    """(signature, source lines) of ``"module:qualname"`` read from its source file, not imported.

    ``origin``: read that file instead of the installed module's (tests: a modified copy).
    """
    module, _, qualname = upstream.partition(":")
    origin = _source_file(module) if origin is None else origin
    text = Path(origin).read_text(encoding="utf-8")
    lines = text.splitlines()
    if not qualname:
        return "", lines
    node: Any = ast.parse(text)
    for part in qualname.split("."):
        found = [
            n
            for n in getattr(node, "body", [])
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part
        ]
        if not found:
            raise LookupError(f"{upstream}: {part!r} not found in {origin}")
        node = found[-1]
    signature = "" if isinstance(node, ast.ClassDef) else ast.unparse(node.args)
    return signature, lines[node.lineno - 1 : node.end_lineno]


def fingerprint_of(upstream: str, anchors: tuple[str, ...], origin: str | Path | None = None) -> str:
    """sha256 of the signature and of every line holding an anchor (16 hex digits).

    Raises LookupError naming an anchor that no line holds any more.
    """
    signature, lines = upstream_source(upstream, origin)
    picked = []
    for anchor in anchors:
        hits = [line.strip() for line in lines if anchor in line]
        if not hits:
            raise LookupError(f"{upstream}: no line holds {anchor!r} any more")
        picked.append(hits)
    blob = json.dumps([signature, picked])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def check_patch(patch: Patch, origin: str | Path | None = None) -> str | None:
    """None when the upstream still matches ``patch``; else what changed and what to re-check."""
    try:
        now = fingerprint_of(patch.upstream, patch.anchors, origin)
    except LookupError as exc:
        return f"[{patch.key}] {exc}; re-check: {patch.why}"
    if now == patch.fingerprint:
        return None
    signature, _ = upstream_source(patch.upstream, origin)
    return (
        f"[{patch.key}] {patch.upstream} changed (fingerprint {patch.fingerprint} -> {now}; signature "
        f"now ({signature}); lines holding {list(patch.anchors)}). Re-check: {patch.target} -> "
        f"{patch.replacement or '(read)'}: {patch.why}"
    )


# ----------------------------------------------------------------------------- applying
_HOOKS: dict[str, list[Callable[[ModuleType], None]]] = {}
_APPLIED: set[tuple[str, str]] = set()
_LOCK = threading.RLock()


def _run_hooks(module: ModuleType) -> None:
    with _LOCK:
        for hook in _HOOKS.get(module.__name__, []):
            key = (module.__name__, f"{hook.__module__}.{hook.__qualname__}")
            if key not in _APPLIED:
                _APPLIED.add(key)
                hook(module)


class _HookedLoader(importlib.abc.Loader):
    """Wraps a module's real loader and runs the registered patches right after it executes."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run_hooks(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds hooked modules through the other finders and wraps their loaders.

    Hand-written rather than ``wrapt.register_post_import_hook``: importing wrapt costs every Ray
    worker ~40-80 ms more (bench/post_import_hooks.py: x2.7 the time of this finder)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _HookedLoader):
                    spec.loader = _HookedLoader(spec.loader)
                return spec
        return None


def when_imported(module_name: str, hook: Callable[[ModuleType], None]) -> None:
    """Run ``hook(module)`` once, right after ``module_name`` is imported (now if it already is)."""
    with _LOCK:
        _HOOKS.setdefault(module_name, [])
        if hook not in _HOOKS[module_name]:
            _HOOKS[module_name].append(hook)
        if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _PostImportFinder())
    module = sys.modules.get(module_name)
    if module is not None:
        _run_hooks(module)


def _resolve(path: str) -> Callable[[ModuleType], None]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def apply(stage: str, lazy: bool = False) -> list[str]:
    """Apply every ``replace`` patch of ``stage``; returns their keys.

    ``lazy``: as post-import hooks (each when its module is first imported, now if it already is);
    else the module is imported now.
    """
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r}: choose one of {STAGES}")
    done = []
    for patch in PATCHES:
        if patch.stage != stage:
            continue
        assert patch.apply and patch.hook_module, patch.key
        hook = _resolve(patch.apply)
        if lazy:
            when_imported(patch.hook_module, hook)
        else:
            hook(importlib.import_module(patch.hook_module))
        done.append(patch.key)
    return done


@contextlib.contextmanager
def swapped(obj: Any, **values: Any) -> Iterator[None]:
    """Set attributes of ``obj`` for the duration of the block, restored after (every scoped patch)."""
    old = {k: getattr(obj, k) for k in values}
    for k, v in values.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


# ----------------------------------------------------------------------------- the registry
_OR = "openrlhf"
_TPR = "openrlhf.cli.train_ppo_ray"
_PPO_ACTOR = "openrlhf.trainer.ray.ppo_actor"
_CLASS_BY_NAME = (
    "train_ppo_ray's train() instantiates the classes it imported by name; OpenRLHF has no option "
    "or registry for the actor / trainer classes"
)

PATCHES: tuple[Patch, ...] = (
    # -- rpg-train's entry point (cli.py) ---------------------------------------------------------
    Patch(
        "parse_args",
        "scoped",
        "argparse",
        "argparse.ArgumentParser.parse_args (while train_ppo_ray runs)",
        "rpg_openrlhf.integration.cli.EntryPoint.parse_args",
        "adds --rpg.*, --rpg.backend, --dry-run to OpenRLHF's own parser; preflight checks before "
        "OpenRLHF's processing",
        "OpenRLHF builds its parser inside train_ppo_ray's `if __name__ == '__main__':` block with no "
        "hook; only the train parser is touched, restored when the run ends",
        f"{_TPR}:",
        ("parser = argparse.ArgumentParser(", "args = parser.parse_args()", "train(args)"),
        "9b4234af1c87d7f8",
    ),  # fmt: skip
    Patch(
        "train",
        "scoped",
        _OR,
        f"{_TPR}.train and its module-level names (in runpy's __main__)",
        "rpg_openrlhf.integration.cli.EntryPoint.train (then train_ppo_ray.train); cli.REBIND",
        "backend, validation, --dry-run, the CPU backend and the RPG classes between OpenRLHF's "
        "argument checks and its train(args); names it imported are re-read after the class swaps",
        "no hook between the argument checks and train(args); the namespace is runpy's __main__ "
        "module (sys.modules['__main__'] while it runs)",
        f"{_TPR}:",
        (
            "def train(args):",
            "from openrlhf.trainer.ray import create_vllm_engines",
            "RayActorGroup,",
            "ReferenceModelActor,",
            "RewardModelActor,",
            "from openrlhf.trainer.ray.ppo_actor import PolicyModelActor",
            "from openrlhf.trainer.ray.ppo_critic import CriticModelActor",
            "from openrlhf.utils import get_strategy",
            "from openrlhf.trainer.ppo_trainer import PPOTrainer",
        ),
        "106808957d334fc8",
    ),  # fmt: skip
    Patch(
        "parser_actions",
        "private",
        "argparse",
        "ArgumentParser._option_string_actions",
        "",
        "accepts `rpg` in --algo.advantage.estimator's choices and marks the defaults of "
        "--algo.kl.init_coef / --algo.advantage.estimator (DefaultFloat / DefaultStr) so that "
        "validation tells a typed value from the default",
        "argparse has no public way to reach an added action; set_defaults cannot change choices",
        f"{_TPR}:",
        (
            '"--algo.advantage.estimator",',
            'parser.add_argument("--algo.kl.init_coef"',
            'choices=["gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo"',
        ),
        "f44d8a5664d65113",
    ),  # fmt: skip
    # -- the RPG classes (installer.py, stage rpg) ------------------------------------------------
    Patch(
        "policy_actor",
        "replace",
        _OR,
        f"{_PPO_ACTOR}.PolicyModelActor",
        "rpg_openrlhf.integration.actor.RPGPolicyModelActor",
        "the RPG actor trainer and Schedule-Free",
        _CLASS_BY_NAME,
        f"{_TPR}:train",
        ("PolicyModelActor,",),
        "b8d8caf57ebf0238",
        stage="rpg",
        apply="rpg_openrlhf.integration.installer:use_rpg_policy_actor",
        hook_module=_PPO_ACTOR,
    ),  # fmt: skip
    Patch(
        "reference_actor",
        "replace",
        _OR,
        "openrlhf.trainer.ray.launcher.ReferenceModelActor",
        "rpg_openrlhf.integration.actor.RPGReferenceModelActor",
        "weight load/dump for the reference refresh",
        _CLASS_BY_NAME,
        f"{_TPR}:train",
        ("ReferenceModelActor,", "if args.algo.kl.init_coef > 0:"),
        "456eda762f21e70d",
        stage="rpg",
        apply="rpg_openrlhf.integration.installer:use_rpg_reference_actor",
        hook_module="openrlhf.trainer.ray.launcher",
    ),  # fmt: skip
    Patch(
        "ppo_trainer",
        "replace",
        _OR,
        "openrlhf.trainer.ppo_trainer.PPOTrainer",
        "rpg_openrlhf.integration.trainer.RPGPPOTrainer",
        "the rpg advantage estimator, reference refresh, --rpg.max_steps",
        _CLASS_BY_NAME + " (PPOTrainer is imported inside train())",
        f"{_TPR}:train",
        ("from openrlhf.trainer.ppo_trainer import PPOTrainer", "ppo_trainer = PPOTrainer.remote("),
        "8b6af280c3bf6b80",
        stage="rpg",
        apply="rpg_openrlhf.integration.installer:use_rpg_ppo_trainer",
        hook_module="openrlhf.trainer.ppo_trainer",
    ),  # fmt: skip
    # -- debug dumps for the multi-rank E2E tests (step_dump.py; off unless RPG_STEP_DUMP_DIR) -----
    Patch(
        "step_dump",
        "replace",
        _OR,
        f"{_PPO_ACTOR}.ActorPPOTrainer.training_step, DeepspeedStrategy.optimizer_step and the "
        "DeepSpeed optimizer's offload/reload (instance attributes, one trainer)",
        "step_dump.install: wrappers that save the micro-batches, the reduced gradient and sleep events",
        "tests check the pipeline from outside (normalizers, gradient, sleep); the wrappers only observe",
        "debug only, instance attributes of one trainer (off unless RPG_STEP_DUMP_DIR is set); "
        "OpenRLHF has no step callback",
        f"{_PPO_ACTOR}:ActorPPOTrainer.training_step",
        ('self.strategy.optimizer_step(self.actor_optim, self.actor, self.actor_scheduler, name="actor")',),
        "ff7a25eff8e51a05",
    ),  # fmt: skip
    # -- entropy logged without a graph (entropy.py; --actor.entropy_coef 0, stock and RPG) -------
    Patch(
        "logged_entropy_actor",
        "replace",
        _OR,
        f"{_PPO_ACTOR}.PolicyModelActor (after the rpg stage)",
        "entropy.LoggedEntropyMixin + the current PolicyModelActor",
        "the worker installs the detached entropy (entropy-worker stage) before its model is built",
        _CLASS_BY_NAME,
        f"{_TPR}:train",
        ("PolicyModelActor,",),
        "b8d8caf57ebf0238",
        stage="entropy",
        apply="rpg_openrlhf.integration.entropy:use_logged_entropy_actor",
        hook_module=_PPO_ACTOR,
    ),  # fmt: skip
    Patch(
        "compute_entropy",
        "replace",
        _OR,
        "openrlhf.models.actor.compute_entropy (in the policy workers)",
        "entropy.entropy_from_logits (no_grad, chunked)",
        "with entropy_coef 0 the entropy is only logged; OpenRLHF's keeps a B x T x vocab graph",
        "Actor.forward computes the differentiable entropy whenever entropy_coef is not None; no "
        "option to log it detached",
        "openrlhf.models.actor:Actor.forward",
        ("if return_entropy:", 'entropy = compute_entropy(output["logits"])'),
        "81c896abca284d52",
        stage="entropy-worker",
        apply="rpg_openrlhf.integration.entropy:use_detached_entropy",
        hook_module="openrlhf.models.actor",
    ),  # fmt: skip
    Patch(
        "actor_trainer",
        "scoped",
        _OR,
        f"{_PPO_ACTOR}.ActorPPOTrainer (during init_model_from_pretrained)",
        "rpg_openrlhf.integration.actor.RPGActorPPOTrainer",
        "the policy actor builds the RPG loss's trainer",
        "PolicyModelActor.init_model_from_pretrained builds ActorPPOTrainer by its module-level name "
        "with ~20 arguments; copying that method would be a larger patch",
        f"{_PPO_ACTOR}:PolicyModelActor.init_model_from_pretrained",
        ("self.trainer = ActorPPOTrainer(",),
        "cf635f3ffa484885",
    ),  # fmt: skip
    Patch(
        "kl_use_loss",
        "scoped",
        _OR,
        "args.algo.kl.use_loss (during make_experience, with a reference model)",
        "True",
        "keeps the reference log-probs on the experience and the KL out of the reward",
        "make_experience computes the reference log-probs inside and drops them unless use_loss; the "
        "KL coefficient is 0, so only this branch differs",
        "openrlhf.trainer.ppo_utils.experience_maker:RemoteExperienceMaker.make_experience",
        (
            "if (self.initial_model_group is not None) and (not args.algo.kl.use_loss):",
            "if not args.algo.kl.use_loss:",
            "base_action_log_probs = None",
        ),
        "0cb3fff0b328b1f5",
    ),  # fmt: skip
    Patch(
        "advantages",
        "override",
        _OR,
        "RemoteExperienceMaker.compute_advantages_and_returns",
        "rpg_openrlhf.integration.trainer.RPGExperienceMaker.compute_advantages_and_returns",
        "the `rpg` estimator: OpenRLHF's length penalties, reward clip and per-token returns (its public "
        "helpers), then core.group_advantages",
        "OpenRLHF 0.11.2 has no estimator registry (an if/elif on the name); a subclass is its "
        "extension point",
        "openrlhf.trainer.ppo_utils.experience_maker:RemoteExperienceMaker.compute_advantages_and_returns",
        (
            "apply_length_penalties(experiences, args)",
            "reward = compute_reward(",
            "self.kl_ctl.value,",
            "reward_clip_range=args.reward.clip_range,",
            "experience.returns = self.get_cumulative_returns(",
            'experience.info["return"] = reward.sum(dim=-1)',
            "experience.kl = None",
            "experience.rewards = experience.rewards.to(torch.promote_types(experience.rewards.dtype, torch.float32))",
            'experience.info["group_reward_std"] = group_reward_std',
        ),
        "a0542174326fbea5",
    ),  # fmt: skip
    Patch(
        "policy_loss",
        "override",
        _OR,
        "openrlhf.models.loss.PolicyLoss.__call__ (ActorPPOTrainer.actor_loss_fn)",
        "rpg_openrlhf.integration.actor.RPGPolicyLoss.__call__",
        "the RPG loss with PolicyLoss's signature",
        "actor_loss_fn is an attribute of the actor trainer (set in a subclass)",
        "openrlhf.models.loss:PolicyLoss.forward",
        ("return loss, clip_ratio, ppo_kl, vllm_kl",),
        "516442a70218cbd4",
    ),  # fmt: skip
    Patch(
        "ray_actor_class",
        "private",
        "ray",
        "ActorClass.__ray_actor_class__",
        "",
        "subclassing OpenRLHF's @ray.remote actor and trainer classes (the plain class behind them)",
        "OpenRLHF exports only the remote-decorated classes",
        "ray.actor:_modify_class",
        ("__ray_actor_class__ = cls",),
        "c640ac17568f1542",
    ),  # fmt: skip
    Patch(
        "deepspeed_initialize",
        "scoped",
        "deepspeed",
        "deepspeed.initialize (during init_model_from_pretrained)",
        "rpg_openrlhf.integration.schedule_free.schedulefree_initialize",
        "--rpg.optimizer schedulefree: hands DeepSpeed a Schedule-Free AdamW client optimizer",
        "OpenRLHF builds the optimizer from its DeepSpeed config (AdamW / Muon only)",
        "openrlhf.utils.deepspeed.deepspeed:DeepspeedStrategy._ds_init_train_model",
        ("engine, optim, _, scheduler = deepspeed.initialize(",),
        "008e14c88746abb0",
    ),  # fmt: skip
    Patch(
        "zero3_privates",
        "private",
        "deepspeed",
        "DeepSpeedZeroOptimizer_Stage3 private methods",
        "",
        "Schedule-Free's x/y switch under ZeRO-3 does what step() does: fill the fp32 groups, write "
        "them into the partitions, re-gather persistent parameters",
        "DeepSpeed has no public way to write master weights back into a ZeRO-3 model",
        "deepspeed.runtime.zero.stage3:DeepSpeedZeroOptimizer_Stage3",
        (
            "def _partition_all_parameters(self):",
            "def _set_fp32_optimizer_param_groups(self):",
            "def _clear_fp32_optimizer_param_groups(self):",
            "def _reassign_or_swap_out_partitioned_parameters(self, sub_group_id):",
            "def invalidate_secondary_tensor(self):",
            "self.persistent_parameters[0].all_gather(self.persistent_parameters)",
        ),
        "2c419bd67505f42b",
    ),  # fmt: skip
    # -- --rpg.max_steps on stock runs (run_length.py, stage budget) -------------------------------
    Patch(
        "budget_trainer",
        "replace",
        _OR,
        "openrlhf.trainer.ppo_trainer.PPOTrainer",
        "rpg_openrlhf.integration.run_length.budgeted_stock_trainer()",
        "stock runs with --rpg.max_steps",
        _CLASS_BY_NAME,
        f"{_TPR}:train",
        ("from openrlhf.trainer.ppo_trainer import PPOTrainer",),
        "74e285bec269d492",
        stage="budget",
        apply="rpg_openrlhf.integration.run_length:use_budgeted_trainer",
        hook_module="openrlhf.trainer.ppo_trainer",
    ),  # fmt: skip
    Patch(
        "generate_samples",
        "replace",
        _OR,
        "PPOTrainer.samples_generator.generate_samples (the instance's)",
        "run_length.RunLengthMixin._rpg_limit_samples_generator",
        "no rollout after the budget: the generator reports the data exhausted",
        "the generator is built inside PPOTrainer.__init__ from a module-level class; fit() has no stop hook",
        "openrlhf.trainer.ppo_trainer:PPOTrainer.fit",
        ("self.samples_generator.generate_samples(**self.generate_kwargs)",),
        "9f2f906e191d09df",
    ),  # fmt: skip
    Patch(
        "save_steps",
        "scoped",
        _OR,
        "args.ckpt.save_steps (the budget's last step)",
        "1",
        "a checkpoint at exactly --rpg.max_steps",
        "save_logs_and_checkpoints decides from args alone",
        "openrlhf.trainer.ppo_trainer:BasePPOTrainer.save_logs_and_checkpoints",
        ("if global_step % self.args.ckpt.save_steps == 0:",),
        "e06711bcde779681",
    ),  # fmt: skip
    # -- CPU backend, driver (cpu.py, stage cpu-driver) -------------------------------------------
    Patch(
        "create_vllm_engines",
        "replace",
        _OR,
        "openrlhf.trainer.ray.vllm_engine.create_vllm_engines",
        "cpu.engine_creator(): vllm_cpu.create_vllm_engines_cpu or hf_rollout.create_hf_rollout_engines",
        '{"GPU": 1} bundles, bf16, trust_remote_code, CUDA graphs, sleep mode',
        "engine creation is a module function with the CUDA choices hard-coded",
        "openrlhf.trainer.ray.vllm_engine:create_vllm_engines",
        (
            'bundles = [{"GPU": 1, "CPU": 1}',
            '"enforce_eager": enforce_eager,',
            '"dtype": "bfloat16",',
            '"trust_remote_code": True,',
            '"enable_sleep_mode": vllm_enable_sleep,',
        ),
        "59e34b45c47f6aef",
        stage="cpu-driver",
        apply="rpg_openrlhf.integration.cpu:use_cpu_engines",
        hook_module="openrlhf.trainer.ray.vllm_engine",
    ),  # fmt: skip
    # -- CPU backend, every Ray worker (cpu.py, stage cpu-worker) ---------------------------------
    Patch(
        "torch_cuda",
        "replace",
        "torch",
        "torch.cuda.set_device / synchronize / empty_cache / current_stream / ipc_collect / current_device",
        "cpu._harmless (current_device() -> torch.device('cpu'))",
        "OpenRLHF calls them unconditionally; is_available() stays False",
        "OpenRLHF calls torch.cuda directly, in many modules",
        "torch.cuda:current_device",
        ("def current_device() -> int:",),
        "fbbcf43fd5c6ca3a",
        stage="cpu-worker",
        apply="rpg_openrlhf.integration.cpu:patch_torch_cuda_hook",
        hook_module="torch",
    ),  # fmt: skip
    Patch(
        "init_device_mesh",
        "replace",
        _OR,
        "openrlhf.utils.deepspeed.deepspeed.init_device_mesh",
        "cpu.use_cpu_device_mesh ('cuda' -> 'cpu')",
        "the strategy builds a 'cuda' device mesh",
        "the device type is a literal in DeepspeedStrategy.setup_distributed",
        "openrlhf.utils.deepspeed.deepspeed:DeepspeedStrategy.setup_distributed",
        ("self.ds_device_mesh = init_device_mesh(", '"cuda", (dp_size, self.ring_attn_size'),
        "e2bcd3ce7f6da8b6",
        stage="cpu-worker",
        apply="rpg_openrlhf.integration.cpu:use_cpu_device_mesh",
        hook_module="openrlhf.utils.deepspeed.deepspeed",
    ),  # fmt: skip
    Patch(
        "moving_average",
        "replace",
        _OR,
        "DeepspeedStrategy.moving_average",
        "cpu.use_cpu_moving_average (device 'cuda' -> 'cpu')",
        "EMA (--train.enable_ema) on 'cuda'",
        "the caller passes device='cuda'",
        "openrlhf.utils.deepspeed.deepspeed:DeepspeedStrategy.moving_average",
        ("data = param.data.to(device)",),
        "c5aed3df5e1b0239",
        stage="cpu-worker",
        apply="rpg_openrlhf.integration.cpu:use_cpu_moving_average",
        hook_module="openrlhf.utils.deepspeed.deepspeed",
    ),  # fmt: skip
    Patch(
        "replay_buffer",
        "replace",
        _OR,
        "NaiveReplayBuffer.__init__",
        "cpu.use_cpu_replay_buffer (target cpu)",
        'builds torch.device(f"cuda:{current_device()}")',
        "the device is built in __init__",
        "openrlhf.trainer.ppo_utils.replay_buffer:NaiveReplayBuffer.__init__",
        ('self.target_device = torch.device(f"cuda:{torch.cuda.current_device()}")',),
        "30833a065fe8a4c3",
        stage="cpu-worker",
        apply="rpg_openrlhf.integration.cpu:use_cpu_replay_buffer",
        hook_module="openrlhf.trainer.ppo_utils.replay_buffer",
    ),  # fmt: skip
    Patch(
        "zero3_gather",
        "replace",
        "deepspeed",
        "deepspeed.runtime.zero.partition_parameters.Init._allgather_params_coalesced",
        "zero.use_complete_gathers (the original, one parameter at a time)",
        "waits for the last of several async all-gathers only: on gloo earlier parameters can be "
        "unwritten (NaN log-probs after ZeRO-3 loading)",
        "every multi-parameter gather (transformers' ZeRO-3 loading, persistent parameters) calls it",
        "deepspeed.runtime.zero.partition_parameters:Init._allgather_params_coalesced",
        ("launch_handles[-1].wait()", "if not get_accelerator().resolves_data_dependency():"),
        "3e9d3e3d6f8f33e4",
        stage="cpu-worker",
        apply="rpg_openrlhf.integration.zero:use_complete_gathers",
        hook_module="deepspeed.runtime.zero.partition_parameters",
    ),  # fmt: skip
    Patch(
        "sync_group",
        "replace",
        _OR,
        f"{_PPO_ACTOR}.stateless_init_process_group (vLLM rollouts)",
        "vllm_cpu.stateless_init_gloo_group",
        "PyNccl on the trainer's rank 0 -> a gloo group; "
        "_init_vllm_sync_group and broadcast_to_vllm then run unchanged",
        "--vllm.sync_backend selects only torch's group, not the PyNccl path",
        f"{_PPO_ACTOR}:ActorPPOTrainer._init_vllm_sync_group",
        ("self._model_update_group = stateless_init_process_group(",),
        "193d2cf1e8f6b81d",
        stage="cpu-worker",
        apply="rpg_openrlhf.integration.cpu:use_gloo_sync_group",
        hook_module=_PPO_ACTOR,
    ),  # fmt: skip
    Patch(
        "sync_check",
        "replace",
        _OR,
        "ActorPPOTrainer.broadcast_to_vllm (RPG_SYNC_CHECK_DIR only)",
        "the original, then vllm_cpu.record_engine_sync",
        "debug/tests: engine vs actor log-probs after a sync",
        "no post-sync hook",
        f"{_PPO_ACTOR}:ActorPPOTrainer.broadcast_to_vllm",
        ("def broadcast_to_vllm(self):",),
        "dc52443e20b01093",
        stage="cpu-worker",
        apply="rpg_openrlhf.integration.cpu:use_sync_check",
        hook_module=_PPO_ACTOR,
    ),  # fmt: skip
    Patch(
        "object_store_sync",
        "replace",
        _OR,
        "ActorPPOTrainer._init_vllm_sync_group / broadcast_to_vllm (RPG_CPU_ROLLOUT=hf)",
        "no group; cpu.broadcast_state_dict_to_engines",
        "HF rollout actors get weights through Ray's object store",
        "the sync path is NCCL / CUDA IPC only",
        f"{_PPO_ACTOR}:ActorPPOTrainer.broadcast_to_vllm",
        ("def broadcast_to_vllm(self):", "def _broadcast_param(param, count, num_params):"),
        "e03538083c24f01f",
        stage="cpu-worker",
        apply="rpg_openrlhf.integration.cpu:use_object_store_sync",
        hook_module=_PPO_ACTOR,
    ),  # fmt: skip
    # -- vLLM engine process (vllm_worker.py / vllm_cpu.py) ---------------------------------------
    Patch(
        "cpu_gemm",
        "replace",
        "vllm",
        "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm",
        "vllm_worker.keep_plain_linear_weights (remove_weight=False)",
        "CPU GEMM packing drops the plain weight: synced weights would fail or be ignored",
        "vLLM has no option to keep it",
        "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm",
        ("remove_weight",),
        "4f330b287b98a53a",
        stage="vllm-engine",
        apply="rpg_openrlhf.integration.vllm_worker:use_plain_linear_weights",
        hook_module="vllm.model_executor.layers.utils",
    ),  # fmt: skip
    Patch(
        "worker_wrap",
        "override",
        _OR,
        "WorkerWrap.init_process_group / update_weight",
        "vllm_worker.CPUWorkerWrap (vLLM's worker_extension_cls)",
        "gloo, CPU tensors, repacking",
        "an extension point (worker_extension_cls)",
        "openrlhf.trainer.ray.vllm_worker_wrap:WorkerWrap.update_weight",
        (
            'weight = torch.empty(shape, dtype=dtype, device="cuda")',
            "self.model_runner.model.load_weights(weights=[(name, weight)])",
        ),
        "0e9c639ef5e55424",
    ),  # fmt: skip
    Patch(
        "rollout_generate",
        "override",
        _OR,
        "RolloutRayActor.generate",
        "vllm_cpu.CPURolloutEngine.generate",
        "n > 1 returned only the last streamed output (FINAL_ONLY requested)",
        "a subclass of the engine actor",
        "openrlhf.trainer.ray.vllm_engine:RolloutRayActor.generate",
        ("async for request_output in generator:", "final_output = request_output"),
        "03809f8a075342b4",
    ),  # fmt: skip
    # -- rpg-eval (eval/, which never imports this module; listed here to be checked with the rest) -
    Patch(
        "lm_eval_env_info",
        "scoped",
        "lm_eval",
        "lm_eval.evaluator.add_env_info / get_git_commit_hash",
        "no-ops (rpg_eval.runner._no_lm_eval_env_info)",
        "~0.3 s of collect_env and git per call "
        "(23% of generation time, bench/eval_overhead.py), for results never read",
        "simple_evaluate always calls them",
        "lm_eval.evaluator:simple_evaluate",
        ('results["git_hash"] = get_git_commit_hash()', "add_env_info(results)"),
        "185bc59baf3ba97a",
    ),  # fmt: skip
    Patch(
        "lm_eval_repeats",
        "private",
        "lm_eval",
        "lm-eval's repeated Instance objects (grouped by id())",
        "",
        "rpg_eval.lm_models groups a problem's k samples by identity to seed them per problem",
        "lm-eval passes no sample index to generate_until",
        "lm_eval.evaluator:evaluate",
        ("cloned_reqs.extend([req] * req.repeats)",),
        "6d685a5bd2c0dbab",
    ),  # fmt: skip
)

BY_KEY: dict[str, Patch] = {p.key: p for p in PATCHES}


def count(kinds: tuple[str, ...] = ("replace", "scoped", "private")) -> int:
    """Patches proper (overrides through an extension point are not patches)."""
    return sum(p.kind in kinds for p in PATCHES)


def table() -> str:
    """The Markdown table of docs/contracts.md, "The seam"."""
    rows = [
        "| key | kind | upstream (package) | replaced by | why | why no extension point |",
        "|---|---|---|---|---|---|",
    ]
    for p in PATCHES:
        where = f" (stage `{p.stage}`)" if p.stage else ""
        cells = [
            f"`{p.key}`",
            p.kind + where,
            f"`{p.target}` ({p.package})",
            p.replacement or "-",
            p.why,
            p.kept,
        ]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def _main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m rpg_openrlhf.integration.seam", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--table", action="store_true", help="print the Markdown table of docs/contracts.md")
    parser.add_argument("--fingerprints", action="store_true", help="print each patch's current fingerprint")
    args = parser.parse_args(argv)
    if args.table:
        print(table())
    if args.fingerprints:
        for p in PATCHES:
            try:
                now = fingerprint_of(p.upstream, p.anchors)
            except LookupError as exc:
                now = f"ERROR {exc}"
            print(f"{p.key:24s} {now} {'ok' if now == p.fingerprint else 'CHANGED'}")


if __name__ == "__main__":
    _main()
