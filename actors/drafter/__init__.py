"""The drafter: an EAGLE / EAGLE-3 head with its own draft KV cache, proposing k tokens for a batch."""
