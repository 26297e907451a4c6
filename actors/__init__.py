"""Eagle Cluster actors: what runs on an accelerator, with no knowledge of Ray Serve or HTTP.

- ``actors.eagle``: EAGLE-1 (Llama 4) and EAGLE-3 draft heads in plain PyTorch, with vLLM's checkpoint layouts.
"""
