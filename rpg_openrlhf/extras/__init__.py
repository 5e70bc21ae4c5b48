"""OpenRLHF add-ons that stock and RPG runs share: ``run_length`` (``--rpg.max_steps``, a budget of
rollout steps with a checkpoint at its last step), ``entropy`` (the entropy logged without an autograd
graph when it is not optimized), ``step_dump`` (debug dumps of the actor's training steps for tests),
``patches`` (their seam entries). Imports only the shared floor (``rpg_openrlhf.common``)."""
