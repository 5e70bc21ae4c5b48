"""``python -m rpg_openrlhf.nodecheck`` (``make gpu-check``): what a user runs first on a new GPU node.

In a few minutes, on a tiny model, ``rpg-train --backend gpu`` in the 8K configs' shape checks the
pipeline there, one line per check (:mod:`.cli`; what each one measures: :mod:`.environment`,
:mod:`.measure`), and writes ``report.json`` in ``--out``; ``--report DIR`` reads an earlier check's
directory again. The thresholds of the bf16 gaps have not been measured on a GPU yet (none was
available): the lines print the measured values so that a first run can set them.
"""
