"""The extras' seam entries: OpenRLHF add-ons that stock and RPG runs share (the rollout-step budget,
the entropy logged without a graph, the debug step dumps). Plain data.

Stages: ``budget`` (driver, stock runs with ``--rpg.max_steps``), ``entropy`` (driver) and
``entropy-worker`` (each policy worker), with ``--actor.entropy_coef 0``.
"""

from rpg_openrlhf.common.seam import CLASS_BY_NAME, PPO_ACTOR, Patch

_OR = "openrlhf"

PATCHES: tuple[Patch, ...] = (
    Patch(
        key="budget_trainer",
        kind="replace",
        package=_OR,
        target="openrlhf.trainer.ppo_trainer.PPOTrainer",
        replacement="rpg_openrlhf.extras.run_length.budgeted_stock_trainer()",
        why="stock runs with --rpg.max_steps",
        why_no_extension_point=CLASS_BY_NAME,
        upstream="openrlhf.cli.train_ppo_ray:train",
        anchors=("from openrlhf.trainer.ppo_trainer import PPOTrainer",),
        fingerprint="74e285bec269d492",
        stage="budget",
        apply="rpg_openrlhf.extras.run_length:use_budgeted_trainer",
        hook_module="openrlhf.trainer.ppo_trainer",
    ),
    Patch(
        key="generate_samples",
        kind="replace",
        package=_OR,
        target="PPOTrainer.samples_generator.generate_samples, GenerateSamplesActor.samples_generator.generate_samples (the instance's)",
        replacement="run_length.limit_samples_generator",
        why="no rollout after the budget: the generator reports the data exhausted",
        why_no_extension_point="the generator is built inside PPOTrainer.__init__ from a module-level class; fit() has no stop hook",
        upstream="openrlhf.trainer.ppo_trainer:PPOTrainer.fit",
        anchors=("self.samples_generator.generate_samples(**self.generate_kwargs)",),
        fingerprint="9f2f906e191d09df",
    ),
    Patch(
        key="async_budget",
        kind="override",
        package=_OR,
        target="GenerateSamplesActor.get_max_steps; the async trainer's start step reaching the generator (RPG runs)",
        replacement="async_budget.GeneratorBudgetMixin / TrainerBudgetMixin",
        why="--rpg.max_steps under --train.async_enable: the generator actor produces the batches up to step N only; the training actor tells it the start step from init_checkpoint_states",
        why_no_extension_point="the generator and the trainer are separate actors; fit() restores the checkpoint in the trainer before it starts the generator's loop, the only moment both are free",
        upstream="openrlhf.trainer.ppo_trainer_async:PPOTrainerAsync.fit",
        anchors=(
            "checkpoint_states = ray.get(self.trainer_actor.init_checkpoint_states.remote())",
            "self.generator_actor.fit.remote(episode=start_episode, total_consumed_prompts=total_consumed_prompts),",
        ),
        fingerprint="1d4f8cfbeedcb513",
    ),
    Patch(
        key="save_steps",
        kind="scoped",
        package=_OR,
        target="args.ckpt.save_steps (the budget's last step)",
        replacement="1",
        why="a checkpoint at exactly --rpg.max_steps",
        why_no_extension_point="save_logs_and_checkpoints decides from args alone",
        upstream="openrlhf.trainer.ppo_trainer:BasePPOTrainer.save_logs_and_checkpoints",
        anchors=("if global_step % self.args.ckpt.save_steps == 0:",),
        fingerprint="e06711bcde779681",
    ),
    Patch(
        key="step_dump",
        kind="replace",
        package=_OR,
        target="openrlhf.trainer.ray.ppo_actor.ActorPPOTrainer.training_step, DeepspeedStrategy.optimizer_step and the DeepSpeed optimizer's offload/reload (instance attributes, one trainer)",
        replacement="step_dump.attach: wrappers that save the micro-batches, the reduced gradient and sleep events",
        why="tests check the pipeline from outside (normalizers, gradient, sleep); the wrappers only observe",
        why_no_extension_point="debug only, instance attributes of one trainer (off unless RPG_STEP_DUMP_DIR is set); OpenRLHF has no step callback",
        upstream=f"{PPO_ACTOR}:ActorPPOTrainer.training_step",
        anchors=(
            'self.strategy.optimizer_step(self.actor_optim, self.actor, self.actor_scheduler, name="actor")',
            "dynamic_batch=self.args.train.dynamic_batch_enable,",  # the normalizers the dump mirrors
        ),
        fingerprint="632ce7106ecfb552",
    ),
    Patch(
        key="logged_entropy_actor",
        kind="replace",
        package=_OR,
        target="openrlhf.trainer.ray.ppo_actor.PolicyModelActor (after the rpg stage)",
        replacement="entropy.LoggedEntropyMixin + the current PolicyModelActor",
        why="the worker switches to the detached entropy (entropy-worker stage) before its model is built",
        why_no_extension_point=CLASS_BY_NAME,
        upstream="openrlhf.cli.train_ppo_ray:train",
        anchors=("PolicyModelActor,",),
        fingerprint="b8d8caf57ebf0238",
        stage="entropy",
        apply="rpg_openrlhf.extras.entropy:use_logged_entropy_actor",
        hook_module=PPO_ACTOR,
    ),
    Patch(
        key="compute_entropy",
        kind="replace",
        package=_OR,
        target="openrlhf.models.actor.compute_entropy (in the policy workers)",
        replacement="entropy.entropy_from_logits (no_grad, chunked)",
        why="with entropy_coef 0 the entropy is only logged; OpenRLHF's keeps a B x T x vocab graph",
        why_no_extension_point="Actor.forward computes the differentiable entropy whenever entropy_coef is not None; no option to log it detached",
        upstream="openrlhf.models.actor:Actor.forward",
        anchors=("if return_entropy:", 'entropy = compute_entropy(output["logits"])'),
        fingerprint="81c896abca284d52",
        stage="entropy-worker",
        apply="rpg_openrlhf.extras.entropy:use_detached_entropy",
        hook_module="openrlhf.models.actor",
    ),
)
