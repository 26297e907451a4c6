"""The verifier: a vLLM engine for the Llama 4 target whose EAGLE proposer drafts remotely.

One step, file by file: ``worker.py`` (vLLM's ``worker_cls``) puts ``vllm_adapter.py``'s ``RemoteEagleProposer`` in
model runner V1's drafter slot, or ``vllm_v2_adapter.py``'s ``RemoteSpeculatorV2`` in runner V2's speculator slot
(which runner: ``actors.vllm_engine.choose_model_runner``); the adapter turns vLLM's rows into sequences and a
``DraftStep`` (``step_rows.py``, ``prefix.py``); ``speculation.py`` runs the step over the seam, ``speculator.py``:
the policy's k (``draft_length.py``), acceptance (``acceptance.py``), the step sent and its ``Drafts`` collected
through ``remote_speculator.py``, which splits it among the drafters' homes (``homes.py``) and keeps the usable
drafters (``drafters.py``); ``step_stats.py`` counts. ``engine.py`` builds the engine arguments; ``options.py``
refuses the ones the remote drafter cannot work with; ``draft_handoff.py`` spares the engine core a round trip after
a step without drafts.
"""
