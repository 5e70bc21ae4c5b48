"""Numbers from sample records: ``rpg-eval summarize``, ``score``, ``compare``.

``metrics`` (mean@k, pass@k, the bootstrap), ``majority`` (maj@k), ``scores`` (the list of scores every
table and plot draws from), ``summary`` (summary.csv, last_best.csv), ``rescore`` (offline
re-grading); ``problems`` (per-problem scores of a run), ``paired`` (the exact sign-flip test and its
interval), ``seeds`` (several seeds of one method), ``heldout`` (a Best chosen on held-out samples)
and ``compare`` (two runs on the same problems).
"""
