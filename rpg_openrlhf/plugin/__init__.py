"""RPG inside OpenRLHF: the ``--rpg.*`` flags (``flags``, ``validation``), turning RPG on in the driver
(``enable``), the actor and its loss (``actor``), the PPO trainer with the ``rpg`` advantage estimator
and the reference refresh (``trainer``, ``ref_refresh``), Schedule-Free inside DeepSpeed
(``schedule_free``), non-finite inputs stopping every rank (``finite``), the math reward
(``reward``: the eval package's grader), and its seam entries (``patches``). Imports the core, the
extras and the shared floor; never the CPU backend."""
