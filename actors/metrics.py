"""Speculative-decoding counters under vLLM's names, and the acceptance table the seed PRs print.

``num_drafts``: verification steps that carried drafts; ``num_draft_tokens``: draft tokens proposed;
``num_accepted_tokens``: draft tokens accepted; ``accepted_per_pos[i]``: drafts whose i-th token was accepted.
Mean acceptance length = 1 + accepted / drafts (tokens emitted per verification step).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecDecodeStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def acceptance_at(self, pos: int) -> float:
        if not self.num_drafts or pos >= len(self.accepted_per_pos):
            return 0.0
        return self.accepted_per_pos[pos] / self.num_drafts

    def __sub__(self, other: SpecDecodeStats) -> SpecDecodeStats:
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pad = lambda xs: list(xs) + [0] * (n - len(xs))  # noqa: E731
        return SpecDecodeStats(
            self.num_drafts - other.num_drafts,
            self.num_draft_tokens - other.num_draft_tokens,
            self.num_accepted_tokens - other.num_accepted_tokens,
            [a - b for a, b in zip(pad(self.accepted_per_pos), pad(other.accepted_per_pos), strict=True)],
        )

    def table(self, total_output_tokens: int | None = None) -> str:
        lines = []
        if total_output_tokens is not None:
            lines.append(f"total_num_output_tokens: {total_output_tokens}")
        lines += [
            f"num_drafts: {self.num_drafts}",
            f"num_draft_tokens: {self.num_draft_tokens}",
            f"num_accepted_tokens: {self.num_accepted_tokens}",
            f"mean acceptance length: {self.mean_acceptance_length:.2f}",
            "-" * 50,
        ]
        lines += [f"acceptance at token {i}: {self.acceptance_at(i):.2f}" for i in range(len(self.accepted_per_pos))]
        return "\n".join(lines)


COUNTER_KEYS = ("rehomed", "drafters", "quarantined", "prefix_hit_tokens", "prefix_miss_tokens")  # on /metrics
WAIT_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass
class WaitHistogram:
    """How long each draft step waited for the drafters (``StepTiming.wait_ms``; 0 for a step answered from branch
    tables or with nothing to wait for), as the Prometheus histogram ``eagle_cluster_step_wait_seconds``."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS_S) + 1))  # per bucket; last: +Inf
    sum_s: float = 0.0

    def observe(self, wait_ms: float) -> None:
        s = max(wait_ms, 0.0) / 1000
        self.counts[next((i for i, b in enumerate(WAIT_BUCKETS_S) if s <= b), len(WAIT_BUCKETS_S))] += 1
        self.sum_s += s

    def prometheus(self, name: str) -> list[str]:
        lines, total = [], 0
        for bound, n in zip((*(repr(b) for b in WAIT_BUCKETS_S), "+Inf"), self.counts, strict=True):
            total += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {total}')
        return lines + [f"{name}_sum {self.sum_s}", f"{name}_count {total}"]


@dataclass
class ProposerStats:
    """What the verifier's proposer counted (``actors.verifier.speculation``), as the worker RPC ``eagle_cluster_stats``
    returns it (plain dicts: ``to_dict`` / ``from_dict``) and ``VerifierServer.spec_stats`` answers it."""

    steps: int = 0  # draft steps sent to the drafters
    failures: int = 0  # steps with a failed drafter (placeholders proposed)
    per_request: dict[str, SpecDecodeStats] = field(default_factory=dict)  # the latest requests
    branch_lookups: int = 0  # sequences with drafts precomputed for their step (asynchronous drafting)
    branch_hits: int = 0  # ... answered from them
    per_request_branch_hits: dict[str, int] = field(default_factory=dict)
    acceptance_by_source: dict[str, SpecDecodeStats] = field(default_factory=dict)  # branch / on_demand
    client: dict[str, Any] = field(default_factory=dict)  # the speculator's: rehomed, homes, events, drafters
    replica: str = ""  # the verifier replica, when a Serve replica answers
    step_waits: WaitHistogram = field(default_factory=WaitHistogram)  # each draft step's wait for the drafters
    # sequences proposed no draft tokens (vLLM verified none for them), by reason: no_drafter, failed, context, full
    undrafted: dict[str, int] = field(default_factory=dict)
    steps_without_drafts: int = 0  # steps verified target-only: no sequence drafted, no drafter could draft them
    # steps per chosen draft length k = 0..K (``actors.verifier.draft_length``), and the policy's estimated output
    # tokens per second at the last step (0: no estimate, e.g. a fixed k)
    speculative_tokens: list[int] = field(default_factory=list)
    estimated_goodput: float = 0.0
    # ``auto``'s estimates: output tokens per second, by batch-size bucket ("1", "2", "3-4", ...) and k = 0..K
    # (None: not measured yet); empty for a fixed k or a schedule
    goodput_by_k: dict[str, list[float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProposerStats:
        """From ``to_dict``'s output (other keys, such as the worker's timings, are left out)."""
        kw = {f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d}
        for name in ("per_request", "acceptance_by_source"):
            kw[name] = {k: SpecDecodeStats(**v) for k, v in kw.get(name, {}).items()}
        if isinstance(kw.get("step_waits"), dict):
            kw["step_waits"] = WaitHistogram(**kw["step_waits"])
        return cls(**kw)

    @classmethod
    def of_driver(cls, rpc: list[dict[str, Any]]) -> ProposerStats:
        """The driver rank's, from ``collective_rpc("eagle_cluster_stats")`` (one dict per rank)."""
        return cls.from_dict(next(r for r in rpc if r["is_driver"]))

    def prometheus(self) -> str:
        """Prometheus counters: the drafter pool as this verifier sees it."""
        counters = [
            ("eagle_cluster_draft_steps_total", "draft steps sent to the drafter pool", {"": self.steps}),
            ("eagle_cluster_draft_failures_total", "draft steps with a failed drafter (its sequences got no drafts)",
             {"": self.failures}),
            ("eagle_cluster_steps_without_drafts_total", "steps verified without draft tokens because no drafter "
             "could draft (target-only)", {"": self.steps_without_drafts}),
            ("eagle_cluster_undrafted_sequences_total", "sequences proposed no draft tokens for a step, by reason",
             {f'{{reason="{r}"}}': n for r, n in sorted(self.undrafted.items())}),
            ("eagle_cluster_rehomed_sequences_total", "sequences moved to another drafter replica",
             {"": self.client.get("rehomed", 0)}),
            ("eagle_cluster_branch_lookups_total", "sequences with drafts precomputed for their step (async drafting)",
             {"": self.branch_lookups}),
            ("eagle_cluster_branch_hits_total", "sequences answered from precomputed drafts (async drafting)",
             {"": self.branch_hits}),
            ("eagle_cluster_draft_prefix_hit_tokens", "prompt positions vLLM's prefix cache skipped that the drafter "
             "found in its own prefix cache", {"": self.client.get("prefix_hit_tokens", 0)}),
            ("eagle_cluster_draft_prefix_miss_tokens", "prompt positions vLLM's prefix cache skipped that the drafter "
             "lacked (evicted, on another drafter, re-homed): drafted from what follows",
             {"": self.client.get("prefix_miss_tokens", 0)}),
        ]
        for name, key, help_text in (("drafts", "num_drafts", "verified draft runs"),
                                     ("accepted_tokens", "num_accepted_tokens", "accepted draft tokens")):
            counters.append((f"eagle_cluster_{name}_total", f"{help_text}, by where the drafts came from",
                             {f'{{source="{src}"}}': getattr(s, key) for src, s in self.acceptance_by_source.items()}))
        gauges = [("eagle_cluster_drafters", "drafter replicas this verifier uses", self.client.get("drafters", 0)),
                  ("eagle_cluster_quarantined_drafters", "drafters dropped for failing or timing out, waiting for "
                   "a health probe to answer", self.client.get("quarantined", 0))]
        lines = []
        for name, help_text, values in counters:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            lines += [f"{name}{labels} {value}" for labels, value in values.items()]
        for name, help_text, value in gauges:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
        name = "eagle_cluster_step_wait_seconds"
        lines += [f"# HELP {name} how long each draft step waited for the drafters (0: answered from branch tables)",
                  f"# TYPE {name} histogram", *self.step_waits.prometheus(name)]
        lines += self._speculative_tokens_lines()
        return "\n".join(lines) + "\n"

    def _speculative_tokens_lines(self) -> list[str]:
        """``eagle_cluster_speculative_tokens``: the draft length chosen per step, a histogram with one bucket per
        k (``le="0"`` .. ``le="K"``, ``+Inf``); ``eagle_cluster_estimated_goodput_tokens_per_second``."""
        name = "eagle_cluster_speculative_tokens"
        lines = [f"# HELP {name} draft tokens per sequence chosen for each step (0: a target-only step)",
                 f"# TYPE {name} histogram"]
        total = 0
        for k, n in enumerate(self.speculative_tokens):
            total += n
            lines.append(f'{name}_bucket{{le="{k}"}} {total}')
        lines += [f'{name}_bucket{{le="+Inf"}} {total}',
                  f"{name}_sum {sum(k * n for k, n in enumerate(self.speculative_tokens))}", f"{name}_count {total}"]
        g = "eagle_cluster_estimated_goodput_tokens_per_second"
        lines += [f"# HELP {g} the draft-length policy's estimate of output tokens per second at the last step "
                  "(0: none, a fixed k)", f"# TYPE {g} gauge", f"{g} {self.estimated_goodput}"]
        t = "eagle_cluster_estimated_goodput_by_draft_length"
        lines += [f"# HELP {t} the auto draft-length policy's estimated output tokens per second, by batch size and "
                  "draft length k (what it chooses k by)", f"# TYPE {t} gauge"]
        return lines + [f'{t}{{batch="{b}",k="{k}"}} {v:.3f}' for b, row in self.goodput_by_k.items()
                        for k, v in enumerate(row) if v is not None]


def from_vllm_metrics(metrics) -> SpecDecodeStats:
    """Read the ``vllm:spec_decode_*`` counters from ``LLM.get_metrics()``."""
    stats = SpecDecodeStats()
    for m in metrics:
        if m.name == "vllm:spec_decode_num_drafts":
            stats.num_drafts = int(m.value)
        elif m.name == "vllm:spec_decode_num_draft_tokens":
            stats.num_draft_tokens = int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            stats.num_accepted_tokens = int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            stats.accepted_per_pos = [int(v) for v in m.values]
    return stats


def from_prometheus_text(text: str) -> SpecDecodeStats:
    """Read the counters from vLLM's Prometheus exposition (``/metrics``), summed over label sets."""
    stats = SpecDecodeStats()
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        v = int(float(value))
        if name == "vllm:spec_decode_num_drafts_total":
            stats.num_drafts += v
        elif name == "vllm:spec_decode_num_draft_tokens_total":
            stats.num_draft_tokens += v
        elif name == "vllm:spec_decode_num_accepted_tokens_total":
            stats.num_accepted_tokens += v
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = int(labels.split('position="')[1].split('"')[0])
            per_pos[pos] = per_pos.get(pos, 0) + v
    stats.accepted_per_pos = [per_pos.get(i, 0) for i in range(max(per_pos) + 1)] if per_pos else []
    return stats
