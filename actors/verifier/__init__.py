"""The verifier: a vLLM engine for the Llama 4 target whose EAGLE proposer drafts remotely.

``worker.py`` (vLLM ``worker_cls``) swaps the model runner's ``EagleProposer`` for ``RemoteEagleProposer``
(``proposer.py``), which ships each step's hidden states to a drafter through a ``DraftClient``
(``client.py``). ``engine.py`` builds the engine arguments; ``options.py`` refuses the ones the remote drafter
cannot work with.
"""
