"""The checkpoint room: every file the training side writes or reads for a checkpoint, stock and RPG runs.

* ``commit``: the trainer's checkpoint hooks (:class:`~.commit.CheckpointCommitMixin`, the one override
  of OpenRLHF's ``save_logs_and_checkpoints``) and :class:`~.commit.CheckpointStore`: a tag begun before
  OpenRLHF's save and committed after it (markers, then moved into place, then rotation);
* ``staging``: the workers write each checkpoint into a fresh directory the trainer moves into place;
* ``reference_files``: the RPG reference weights beside the actor's;
* ``run_lock``: one run per ``--ckpt.path`` (``filelock``, held by the driver), the trainer's fence;
* ``resume``: driver side, before Ray: the last complete checkpoint is the one resumed;
* ``rng_state``: the policy workers' RNG state in every checkpoint.

The markers themselves (``common.checkpoints``) stay on the shared floor: ``rpg_eval`` reads them.
"""
