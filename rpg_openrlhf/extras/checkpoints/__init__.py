"""The checkpoint room: every file the training side writes or reads for a checkpoint, stock and RPG runs.

* ``commit``: the trainer's checkpoint hooks (:class:`~.commit.CheckpointCommitMixin`, the one override
  of OpenRLHF's ``save_logs_and_checkpoints``: the order of a step's end) and the commit around
  OpenRLHF's save (completeness markers, the record of tags being written, links refused, rotation);
* ``store``: :class:`~.store.CheckpointStore`, one run's checkpoint files as the trainer writes them
  (begin / commit a tag; the RPG reference weights beside the actor's: hard links, temp files, pruning,
  lookup on resume);
* ``resume``: driver side, before Ray: the last complete checkpoint is the one resumed;
* ``rng_state``: the policy workers' RNG state in every checkpoint.

The markers themselves (``common.checkpoints``) stay on the shared floor: ``rpg_eval`` reads them and
imports no training room.
"""
