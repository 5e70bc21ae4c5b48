"""rpg_eval: evaluation of RPG checkpoints on AIME24/AIME25/AMC23 (lm-eval + math-verify).

Light on import: graders need only math_verify; lm-eval, torch and ray are imported where used.
See docs/eval.md.
"""
