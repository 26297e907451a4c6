"""Prefix caching on the verifier's side: each sequence's first ``DraftStep`` carries its prompt.

With vLLM's prefix caching on, a request whose prompt starts with cached blocks is computed from the first uncached
position P, and the proposer hands the drafter hidden rows from P only (``DraftStep`` ``start_position`` P). The
drafter finds positions [0, P) in its own prefix cache by the blocks' hashes (``actors.drafter.prefix_cache``), so
it needs the prompt's tokens and vLLM's block size: ``PromptAnnouncer`` attaches them to the first step that ships
a sequence (``DraftStep.prompts``, ``block_size``), once per request.

Not announced (the drafter then drafts them as today: from position 0, or from P as a re-homed sequence): requests
with images (vLLM's block hashes include the images' hashes; the drafter's key is tokens only), LoRA requests (the
target's hidden states differ by adapter), prompt embeddings (no token ids), and every request when the engine's
prefix caching is off (no hit to serve).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from actors.messages import DraftStep


class PromptAnnouncer:
    """Which sequences the drafters have been sent the prompt of (until the scheduler finishes them)."""

    def __init__(self, block_size: int, enabled: bool) -> None:
        self.block_size, self.enabled = block_size, enabled
        self.announced: set[str] = set()

    def attach(self, step: DraftStep, requests: dict[str, Any]) -> None:
        """Add to ``step`` the prompts of its sequences not announced before (``requests``: the model runner's
        ``CachedRequestState`` by request id)."""
        if not self.enabled or self.block_size < 1:
            return
        for s in step.seqs:
            if s.req_id in self.announced:
                continue
            self.announced.add(s.req_id)
            state = requests.get(s.req_id)
            prompt = getattr(state, "prompt_token_ids", None)
            if (not prompt or getattr(state, "mm_features", None) or getattr(state, "lora_request", None) is not None
                    or getattr(state, "prompt_embeds", None) is not None):
                continue
            step.prompts[s.req_id] = np.asarray(prompt, dtype=np.int32)
        if step.prompts:
            step.block_size = self.block_size

    def finished(self, req_ids: set[str] | list[str]) -> None:
        self.announced.difference_update(req_ids)
