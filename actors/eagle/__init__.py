"""EAGLE draft heads in plain PyTorch, reading and writing vLLM's checkpoint layouts.

Terms, defined once for the whole project:

- **draft tokens**: the k tokens a head proposes after the last token the target produced.
- **accepted**: a draft token equal to what the target would have produced there (greedy) or kept by the
  rejection sampler (sampling). Drafts are accepted left to right; the first rejection ends the run.
- **recovered token**: the token the target's rejection sampler emits in place of the first rejected draft.
- **bonus token**: the extra token the target samples after the last draft when all k drafts are accepted.
- **mean acceptance length**: 1 + accepted / drafts, tokens emitted per verification step (vLLM's metric).

Files: ``spec.py`` (head config -> typed spec), ``layers.py`` (norms, rotary, attention, MLP),
``heads.py`` (EAGLE-1 Llama 4 head and EAGLE-3 head), ``checkpoint.py`` (load / save vLLM layouts).
"""
