"""Speculative-decoding counters under vLLM's names, and the acceptance table the seed PRs print.

``num_drafts``: verification steps that carried drafts; ``num_draft_tokens``: draft tokens proposed;
``num_accepted_tokens``: draft tokens accepted; ``accepted_per_pos[i]``: drafts whose i-th token was accepted.
Mean acceptance length = 1 + accepted / drafts (tokens emitted per verification step).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
