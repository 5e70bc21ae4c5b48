"""The shared floor: what the training side and the eval package both stand on. Imports no other
room of the project (and no third-party package at import time).

``seam`` (the registry of every patch of third-party code, fingerprinted against the installed
upstream) and ``patches`` (its own entries), ``train_ppo_ray`` (OpenRLHF's training command with a
caller's flags and hook), ``versions`` (the checked versions of upstream packages), ``atomic``
(whole-file writes that never leave a torn file), ``cliutil`` (one-line errors, parse-time number
checks), ``vllm_cpu`` (what vLLM's CPU engine can serve, checked before one starts), ``args``
(flat or nested argument namespaces), ``zero`` (the ZeRO-3 gather loop).
"""
