"""The seam entries of the shared floor: running OpenRLHF's ``train_ppo_ray`` with added flags and a
hook before its ``train(args)`` (:mod:`rpg_openrlhf.common.train_ppo_ray`), Ray's plain class
behind a remote actor class (used by the plug-in and the CPU backend), and the engine-vs-actor check
after each weight sync (stage ``sync-check``, :mod:`rpg_openrlhf.common.sync_check`: applied in the
CPU backend's workers, and on GPU by the worker hook ``rpg-train`` adds with ``RPG_SYNC_CHECK_DIR``),
and the chunked log-prob path (stages ``logprobs`` in the driver and ``logprobs-worker`` in the policy
and reference workers, :mod:`rpg_openrlhf.common.logprobs_path`: both backends, stock and RPG runs).
Plain data: importable anywhere."""

from rpg_openrlhf.common.seam import CLASS_BY_NAME, PPO_ACTOR, TRAIN_PPO_RAY, Patch

PATCHES: tuple[Patch, ...] = (
    Patch(
        key="parse_args",
        kind="scoped",
        package="argparse",
        target="argparse.ArgumentParser.parse_args (while train_ppo_ray runs)",
        replacement="rpg_openrlhf.common.train_ppo_ray.TrainPPORay.parse_args",
        why="adds the caller's flags (rpg-train: --rpg.*, --backend, --dry-run; the CPU backend: --cpu.*) "
        "to OpenRLHF's own parser; the caller's checks run before OpenRLHF's processing",
        why_no_extension_point="OpenRLHF builds its parser inside train_ppo_ray's `if __name__ == '__main__':` "
        "block with no hook; only the train parser is touched, restored when the run ends",
        upstream=f"{TRAIN_PPO_RAY}:",
        anchors=("parser = argparse.ArgumentParser(", "args = parser.parse_args()", "train(args)"),
        fingerprint="9b4234af1c87d7f8",
    ),
    Patch(
        key="train",
        kind="scoped",
        package="openrlhf",
        target="openrlhf.cli.train_ppo_ray.train and its module-level names (in the __main__ module its code runs in)",
        replacement="rpg_openrlhf.common.train_ppo_ray.TrainPPORay.train (then train_ppo_ray.train); "
        "train_ppo_ray.REBIND",
        why="the caller's hook (rpg-train: backend, validation, --dry-run, the CPU backend and the RPG "
        "classes) between OpenRLHF's argument checks and its train(args); names it imported are re-read "
        "after the class swaps",
        why_no_extension_point="no hook between the argument checks and train(args); the namespace is "
        "the __main__ module train_ppo_ray's code runs in (sys.modules['__main__'] while it runs; its module-level "
        "imports of Ray and OpenRLHF's trainer deferred until then: common.deferred_main)",
        upstream=f"{TRAIN_PPO_RAY}:",
        anchors=(
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
        fingerprint="106808957d334fc8",
    ),
    Patch(
        key="ray_actor_class",
        kind="private",
        package="ray",
        target="ActorClass.__ray_actor_class__",
        why="subclassing OpenRLHF's @ray.remote actor, engine and trainer classes (the plain class behind them)",
        why_no_extension_point="OpenRLHF exports only the remote-decorated classes",
        upstream="ray.actor:_modify_class",
        anchors=("__ray_actor_class__ = cls",),
        fingerprint="c640ac17568f1542",
    ),
    Patch(
        key="sync_check",
        kind="replace",
        package="openrlhf",
        target="ActorPPOTrainer.broadcast_to_vllm (RPG_SYNC_CHECK_DIR only)",
        replacement="the original, then sync_check.record_engine_sync",
        why="debug/tests/node check: engine vs actor log-probs after a sync (the CPU backend's workers; GPU runs through a worker setup hook rpg-train adds only with RPG_SYNC_CHECK_DIR)",
        why_no_extension_point="no post-sync hook",
        upstream=f"{PPO_ACTOR}:ActorPPOTrainer.broadcast_to_vllm",
        anchors=("def broadcast_to_vllm(self):",),
        fingerprint="dc52443e20b01093",
        stage="sync-check",
        apply="rpg_openrlhf.common.sync_check:use_sync_check",
        hook_module=PPO_ACTOR,
    ),
    Patch(
        key="chunked_logprobs_policy",
        kind="replace",
        package="openrlhf",
        target="openrlhf.trainer.ray.ppo_actor.PolicyModelActor (after the rpg stage)",
        replacement="logprobs_path.ChunkedLogprobsMixin + the current class",
        why="with the chunked log-prob path the policy and reference workers switch Actor.forward (stage logprobs-worker) before their model is built",
        why_no_extension_point=CLASS_BY_NAME,
        upstream="openrlhf.cli.train_ppo_ray:train",
        anchors=("PolicyModelActor,",),
        fingerprint="b8d8caf57ebf0238",
        stage="logprobs",
        apply="rpg_openrlhf.common.logprobs_path:use_chunked_policy_actor",
        hook_module=PPO_ACTOR,
    ),
    Patch(
        key="chunked_logprobs_reference",
        kind="replace",
        package="openrlhf",
        target="openrlhf.trainer.ray.launcher.ReferenceModelActor (after the rpg stage)",
        replacement="logprobs_path.ChunkedLogprobsMixin + the current class",
        why="the reference model's forward takes the chunked path too (its log-probs enter the RPG loss)",
        why_no_extension_point=CLASS_BY_NAME,
        upstream="openrlhf.cli.train_ppo_ray:train",
        anchors=("ReferenceModelActor,", "if args.algo.kl.init_coef > 0:"),
        fingerprint="456eda762f21e70d",
        stage="logprobs",
        apply="rpg_openrlhf.common.logprobs_path:use_chunked_reference_actor",
        hook_module="openrlhf.trainer.ray.launcher",
    ),
    Patch(
        key="chunked_logprobs_forward",
        kind="replace",
        package="openrlhf",
        target="openrlhf.models.actor.Actor.forward (policy and reference workers, --logprobs.chunked)",
        replacement="rpg_openrlhf.common.logprobs_path.chunked_forward (the original for calls it does not cover)",
        why="log-probs of the response tokens only, the LM head in chunks (core.logprobs.chunked_logprobs): no [N, V] fp32 logits kept for backward; same values",
        why_no_extension_point="Actor.forward always builds, casts and keeps the full logits; OpenRLHF has no option to return hidden states or to apply the head to some positions",
        upstream="openrlhf.models.actor:Actor.forward",
        anchors=(
            "sequences, position_ids, rolled_sequences, ring_attn_pad_len, indices = unpad_and_slice_tensor(",
            "rolled_sequences = torch.roll(sequences, shifts=-1, dims=1)",
            "position_ids.masked_fill_(attention_mask == 0, 1)",
            "output = self.model(sequences, attention_mask=foward_attention_mask, position_ids=position_ids, **mm_inputs)",
            'output["logits"] = output["logits"].to(torch.float32)',
            'output["logits"].div_(self.temperature)',
            'entropy = compute_entropy(output["logits"])',
            'setattr(output, "entropy", entropy[:, :-1])',
            'log_probs = log_probs_from_logits(output["logits"], rolled_sequences)',
            "log_probs = log_probs[:, :-1]",
            "action_log_probs = log_probs[:, -action_mask.shape[1] :] * action_mask.float()",
        ),
        fingerprint="a727b42f1b1b3d7b",
        stage="logprobs-worker",
        apply="rpg_openrlhf.common.logprobs_path:use_chunked_forward",
        hook_module="openrlhf.models.actor",
    ),
    Patch(
        key="chunked_logprobs_head",
        kind="scoped",
        package="transformers",
        target="the LM head module's forward (instance attribute, one Actor.forward call)",
        replacement="logprobs_path.chunked_forward's head_forward: [N, H] hidden states -> the action tokens' log-probs",
        why="the head stays a module call inside the model's forward, so ZeRO-3 gathers its weight once per forward and backward and tied embeddings keep one gradient; the model returns what the head returned as its logits (checked at every call)",
        why_no_extension_point="the causal-LM forward applies self.lm_head to the final hidden states and returns the result; logits_to_keep selects positions but not per row, and the hidden states alone (output_hidden_states) would keep every layer's",
        upstream="transformers.models.qwen3.modeling_qwen3:Qwen3ForCausalLM.forward",
        anchors=(
            "logits = self.lm_head(hidden_states[:, slice_indices, :])",
            "logits=logits,",
        ),
        fingerprint="4dad9c6bdfd0b982",
    ),
)
