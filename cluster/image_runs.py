"""Image prompts and offline vLLM runs on the multimodal checkpoint (``models/llama4-tiny-mm``), shared by the
tests and ``benchmarks.offline multimodal``: target-only, vLLM's colocated EAGLE, and the disaggregated path
(vLLM verifier + a drafter Ray actor). The runs that start Ray want a shared machine's ``flock /work/ray.lock``."""

from __future__ import annotations

import numpy as np

from actors.metrics import SpecDecodeStats, from_vllm_metrics
from cluster.harness import MODELS
from training import corpus

TARGET = MODELS / "llama4-tiny-mm"
HEADS = {"eagle": MODELS / "eagle-llama4-tiny-mm-1l", "eagle3": MODELS / "eagle3-llama4-tiny-mm"}
SIZES = [(64, 64), (100, 50), (64, 200), (150, 150), (40, 90), (128, 64), (90, 90), (30, 30)]
MAX_IMAGES = 2


def image_prompts(n: int, seed: int = 0, max_text_chars: int | None = None) -> list[dict]:
    """n prompts: images (seeded noise with a colour bias, sizes from ``SIZES``) then held-out Python text (its
    first ``max_text_chars`` characters, if given)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    texts = corpus.heldout_prompts(corpus.default_corpus_dir(), n, seed=seed + 1)
    out = []
    for i, text in enumerate(texts):
        images = []
        for j in range(1 + (i % 3 == 2)):  # every third prompt has two images
            h, w = SIZES[(i + j) % len(SIZES)]
            base = rng.integers(0, 256, 3)
            noise = rng.integers(-40, 40, (h, w, 3))
            images.append(Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)))
        text = text[:max_text_chars] if max_text_chars else text
        out.append({"prompt": "<|image|>" * len(images) + text, "multi_modal_data": {"image": images}})
    return out


def generate(llm, prompts, max_tokens: int) -> tuple[list[list[int]], SpecDecodeStats]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], from_vllm_metrics(llm.get_metrics())


def engine_kwargs(**kw):
    return {"limit_mm_per_prompt": {"image": MAX_IMAGES}, **kw}


def target_only(prompts, max_tokens: int):
    from actors.vllm_engine import make_llm

    llm = make_llm(str(TARGET), **engine_kwargs())
    try:
        return generate(llm, prompts, max_tokens)
    finally:
        del llm


def colocated(method: str, prompts, k: int, max_tokens: int):
    from actors.vllm_engine import make_llm

    spec = {"method": method, "model": str(HEADS[method]), "num_speculative_tokens": k}
    llm = make_llm(str(TARGET), speculative_config=spec, **engine_kwargs())
    try:
        return generate(llm, prompts, max_tokens)
    finally:
        del llm


def cluster(method: str, prompts, k: int, max_tokens: int, namespace: str, mm_embeds: bool = True,
            wait_for_prompt_drafts: bool = False):
    """(tokens, vLLM's counters, the proposer's stats) of the disaggregated path (``wait_for_prompt_drafts``: the
    draft client's, ``actors.verifier.remote_speculator``)."""
    import ray

    from actors.drafter.actor import start_drafter_actor
    from actors.drafter.config import DrafterSettings
    from actors.verifier.engine import make_verifier_llm

    name = f"mm-drafter-{method}-{int(mm_embeds)}"
    actor = start_drafter_actor(DrafterSettings(str(HEADS[method]), str(TARGET)), name=name, namespace=namespace)
    spec = {"method": method, "model": str(HEADS[method]), "num_speculative_tokens": k}
    client = {"actor": name, "namespace": namespace, "wait_for_prompt_drafts": wait_for_prompt_drafts}
    llm = make_verifier_llm(str(TARGET), spec, client,
                            **engine_kwargs(additional_config={"eagle_cluster": {"mm_embeds": mm_embeds}}))
    try:
        tokens, stats = generate(llm, prompts, max_tokens)
        rpc = next(r for r in llm.collective_rpc("eagle_cluster_stats") if r["is_driver"])
    finally:
        del llm
        ray.kill(actor)
    return tokens, stats, rpc
