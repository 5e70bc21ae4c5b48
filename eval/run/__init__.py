"""``rpg-eval run``: checkpoints through lm-eval into sample records.

``runner`` (the run: chunks, resume, Ray), ``checkpoints`` (which directories, which steps, complete
or torn), ``outdir`` (the output directory: ownership, lock, run.json fingerprints), ``lm_models``
(lm-eval's HF and vLLM models, seeded per problem), ``taskgen`` + ``tasks/`` (the lm-eval tasks),
``prompts`` (prompt styles), ``patches`` (what rpg-eval changes in lm-eval, declared).
lm-eval, torch and Ray are imported only where a run needs them.
"""
