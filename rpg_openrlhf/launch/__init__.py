"""``rpg-train``: parse OpenRLHF's flags plus the plug-in's, the CPU backend's and its own, check them
before anything expensive starts (``preflight``), choose the backend (``cli.resolve_backend``,
``cluster`` for a Ray cluster started beforehand), start the CPU backend or OpenRLHF's GPU path, turn
the plug-in and the extras on, then run OpenRLHF's ``train``."""
