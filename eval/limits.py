"""The bounds rpg-eval's numbers are checked against when a command line is parsed, in one light
module: ``rpg-eval --help`` and a usage error read them without importing numpy, lm-eval or torch.
"""

# Most samples per problem --n accepts (the paper: 32; lighteval's largest avg@n: 64). The work and
# memory of a run grow with it (lm-eval builds n requests per problem before generating).
MAX_N = 1024
# Smallest positive temperature: below it logits / temperature overflow (inf/nan probabilities in
# torch's sampling; vLLM clamps temperatures under 0.01 for the same reason). 0 = greedy.
MIN_TEMPERATURE = 0.01
# Most bootstrap resamples: the interval's endpoints move by < 0.001 past ~10^4 of them, and
# every resample costs a pass over the problems (10^9 of them was hours and 7.45 GiB per unit).
MAX_ITERS = 100_000
# Longest grading time limit accepted: setitimer overflows near 1e10 s, and no answer is worth an hour.
MAX_TIMEOUT = 3600.0
