"""``rpg-demo``: the CPU demo in one room (docs/demo.md).

``cli`` runs the stages in order; ``config`` (sizes, methods, problems), ``processes``
(subprocesses, logs, time limits), ``training`` (SFT warm-up, RL runs), ``evaluate`` (checkpoints
for rpg-eval), ``report`` (table layout, README) and ``reward`` (the reward file rpg-train loads).
"""
