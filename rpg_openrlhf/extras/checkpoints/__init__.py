"""The checkpoint room: every file the training side writes or reads for a checkpoint, stock and RPG runs.

* ``commit``: the trainer's checkpoint hooks (:class:`~.commit.CheckpointCommitMixin`, the one override
  of OpenRLHF's ``save_logs_and_checkpoints``: the order of a step's end) and the commit around
  OpenRLHF's save (completeness markers, the record of tags being written, links refused, rotation);
  :class:`~.commit.CheckpointStore` is one run's checkpoint files as the trainer writes them (begin /
  commit a tag);
* ``reference_files``: the RPG reference weights beside the actor's (hard links, temp files, pruning,
  lookup on resume);
* ``staging``: the workers write each checkpoint into a fresh directory the run created, which the
  trainer moves into place after the commit (never through a link, never into a folder it did not
  write), and OpenRLHF's rotation after the commit;
* ``run_lock``: one run per ``--ckpt.path`` (an flock held by the driver), the trainer's fence;
* ``resume``: driver side, before Ray: the last complete checkpoint is the one resumed;
* ``rng_state``: the policy workers' RNG state in every checkpoint.

The markers themselves (``common.checkpoints``) stay on the shared floor: ``rpg_eval`` reads them and
imports no training room.
"""
