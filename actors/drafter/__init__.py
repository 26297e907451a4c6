"""The drafter: an EAGLE / EAGLE-3 head with its own draft KV cache, proposing k tokens for a batch.

Files: ``engine.py`` (a step, start to end), ``kv_cache.py`` (a slot per sequence), ``slot_attention.py`` (attention
over the cache as it lies: Triton on CUDA, torch on a CPU), ``decode_step.py`` (a decode step on fixed-shape buffers),
``branch_passes.py`` (pipelined drafting's branch passes, likewise), ``cuda_graphs.py`` (capture and replay),
``branches.py`` / ``branch_budget.py`` (pipelined drafting), ``prefix_cache.py``, ``config.py``, ``placement.py``,
``actor.py`` (the Ray actor).
"""
