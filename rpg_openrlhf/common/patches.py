"""The seam entries of the shared floor: running OpenRLHF's ``train_ppo_ray`` with added flags and a
hook before its ``train(args)`` (:mod:`rpg_openrlhf.common.train_ppo_ray`), Ray's plain class
behind a remote actor class (used by the plug-in and the CPU backend), and the engine-vs-actor check
after each weight sync (stage ``sync-check``, :mod:`rpg_openrlhf.common.sync_check`: applied in the
CPU backend's workers, and on GPU by the worker hook ``rpg-train`` adds with ``RPG_SYNC_CHECK_DIR``).
Plain data: importable anywhere."""

from rpg_openrlhf.common.seam import PPO_ACTOR, TRAIN_PPO_RAY, Patch

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
        target="openrlhf.cli.train_ppo_ray.train and its module-level names (in runpy's __main__)",
        replacement="rpg_openrlhf.common.train_ppo_ray.TrainPPORay.train (then train_ppo_ray.train); "
        "train_ppo_ray.REBIND",
        why="the caller's hook (rpg-train: backend, validation, --dry-run, the CPU backend and the RPG "
        "classes) between OpenRLHF's argument checks and its train(args); names it imported are re-read "
        "after the class swaps",
        why_no_extension_point="no hook between the argument checks and train(args); the namespace is "
        "runpy's __main__ module (sys.modules['__main__'] while it runs)",
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
)
