"""The results page: ``docs/BENCHMARKS.md`` and its plots, rendered from the results kept in ``docs/results/*.json``.

    python -m benchmarks.report            # writes docs/BENCHMARKS.md and docs/img/<table id>.png
    python -m benchmarks.report --check    # exit 1 if docs/BENCHMARKS.md is not what the JSON renders (CI)

Where it sits: the benchmark modules (``benchmarks.served`` and the rest) measure and print; the current figure of
each thing a user asks about is kept, with its command, hardware, date and commit, in one JSON file per table under
``docs/results/`` (files sorted by name give the page's order; consecutive tables with the same ``question`` share a
section). This module only renders them, so a rerun updates a JSON file and then the page: ``benchmarks.served``
writes its tables in this format (``table-NAME.json``: fill in ``question`` and ``notes``).

A table's JSON: ``id``, ``question``, ``title``, ``command``, ``hardware``, ``date``, ``commit``, ``notes``, and
either ``columns`` + ``rows`` (cells are strings, copied as measured) or ``model`` (the GPU model below: its inputs,
assumptions and formulas are shown on the page and its rows are computed here, at render time). Optional ``plot``:
``{"x": column, "y": [columns], "series": [columns], "kind": "line" | "bar", "logx": bool, "xlabel", "ylabel"}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "BENCHMARKS.md"
IMG = ROOT / "docs" / "img"
REQUIRED = ("id", "question", "title", "command", "hardware", "date", "commit", "notes")

HEADER = """# Benchmarks

Each table with its command, the hardware each process had, the date and the commit. CPU: this project's machines
(2 cores, 24 GiB, no GPU; vLLM's CPU build); GPU: one lent H200 without vLLM. The same CPU mode moves 10-25% between
runs: compare ratios measured side by side in one run.

Rendered from `docs/results/*.json` by `python -m benchmarks.report` (`--check` in CI). Earlier figures: git history.
"""


Table = dict[str, Any]


def load(results: Path = RESULTS) -> list[Table]:
    tables = []
    for path in sorted(results.glob("*.json")):
        table = json.loads(path.read_text())
        missing = [key for key in REQUIRED if key not in table]
        if missing:
            raise ValueError(f"{path}: missing {missing}")
        if "model" in table:
            table["columns"], table["rows"] = gpu_model(table["model"])
        for row in table["rows"]:
            if len(row) != len(table["columns"]):
                raise ValueError(f"{path}: row {row} has {len(row)} cells for {len(table['columns'])} columns")
        tables.append(table)
    return tables


# The GPU model -------------------------------------------------------------------------------------------------


def interpolate(points: Mapping[str, float], x: float) -> float:
    """Linear between the measured points (keys are numbers as strings), the nearest one outside them."""
    xs = sorted((float(k), v) for k, v in points.items())
    if x <= xs[0][0]:
        return xs[0][1]
    for (x0, y0), (x1, y1) in zip(xs, xs[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return xs[-1][1]


def at_or_below(points: Mapping[str, float], x: float) -> float:
    """The value at the largest measured point <= x (the smallest point's value below it)."""
    below = [(float(k), v) for k, v in points.items() if float(k) <= x]
    return max(below)[1] if below else min((float(k), v) for k, v in points.items())[1]


def model_steps(m: Mapping[str, Any], batch: int, scale: float) -> dict[str, float]:
    """One batch's modelled step times (ms) and tok/s; ``m`` maps each input's name to its value."""
    per_layer = m["layers"] / m["tp"]
    target = scale * interpolate(m["layer_ms_by_tokens"], batch) * per_layer
    verify = scale * interpolate(m["layer_ms_by_tokens"], batch * (m["k"] + 1)) * per_layer
    draft = interpolate(m["draft_ms_by_batch"], batch)
    sync = verify + m["call_waited_ms"] + draft
    hit = at_or_below(m["hit_rate_by_batch"], batch)
    on_hit = max(verify, interpolate(m["branch_ms_by_batch"], batch)) + 2 * m["call_submit_ms"] + m["ready_get_ms"]
    on_miss = verify + m["call_waited_ms"] + m["call_submit_ms"] + interpolate(m["miss_ms_by_batch"], batch)
    pipelined = hit * on_hit + (1 - hit) * on_miss
    return {
        "target": target, "verify": verify, "draft": draft, "sync": sync, "pipelined": pipelined, "hit": hit,
        "target_tps": 1000 * batch / target,
        "sync_tps": 1000 * batch * m["mal_sync"] / sync,
        "pipelined_tps": 1000 * batch * m["mal_pipelined"] / pipelined,
        "verifiers": verify / draft,
    }


def seed_scale(m: Mapping[str, Any]) -> float:
    proxy = interpolate(m["layer_ms_by_tokens"], m["seed_batch"] * (m["k"] + 1)) * m["layers"] / m["tp"]
    return m["seed_step_ms"] / proxy


def gpu_model(model: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    m = {name: entry["value"] for name, entry in model["inputs"].items()}
    columns = ["verifier", "batch", "target-only ms", "verify ms", "draft ms", "target-only tok/s", "sync tok/s",
               "pipelined tok/s", "sync x target-only", "pipelined x target-only", "R"]
    rows = []
    for label, scale in (("proxy", 1.0), ("seed-scaled", seed_scale(m))):
        for b in model["batches"]:
            s = model_steps(m, b, scale)
            rows.append([label, str(b), f"{s['target']:.2f}", f"{s['verify']:.2f}", f"{s['draft']:.2f}",
                         f"{s['target_tps']:.0f}", f"{s['sync_tps']:.0f}",
                         f"{s['pipelined_tps']:.0f}", f"{s['sync_tps'] / s['target_tps']:.2f}",
                         f"{s['pipelined_tps'] / s['target_tps']:.2f}", f"{s['verifiers']:.1f}"])
    return columns, rows


# Rendering -----------------------------------------------------------------------------------------------------


def cell(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]


def render_table(table: Table) -> list[str]:
    out = [f"### {table['title']}", "", "```bash", table["command"], "```", ""]
    out += [f"**Hardware**: {table['hardware']}. **Date**: {table['date']}. **Commit**: {table['commit']}.", ""]
    if "model" in table:
        model = table["model"]
        out += ["Inputs (measured):", ""]
        out += markdown_table(["input", "value", "source"],
                              [[name, e["value"], e["source"]] for name, e in model["inputs"].items()])
        out += ["", "Assumptions:", ""] + [f"- {a}" for a in model["assumptions"]]
        out += ["", "Formulas (b: verifier batch; h: hit rate; d: draft step):", "", "```"]
        out += model["formulas"] + ["```", "", "Outputs (computed by `benchmarks/report.py`):", ""]
    out += markdown_table(table["columns"], table["rows"]) + ["", table["notes"], ""]
    if "plot" in table:
        out += [f"![{table['id']}](img/{table['id']}.png)", ""]
    return out


def render(tables: Sequence[Table]) -> str:
    out = [HEADER]
    question = None
    for table in tables:
        if table["question"] != question:
            question = table["question"]
            out += [f"## {question}", ""]
        out += render_table(table)
    return "\n".join(out).rstrip() + "\n"


def number(value: str) -> float | None:
    try:
        return float(str(value).split()[0].rstrip("x%"))
    except (ValueError, IndexError):
        return None


def plot(table: Table, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = table["plot"]
    columns = list(table["columns"])
    xi = columns.index(spec["x"])
    groups: dict[str, list[Sequence[str]]] = {}
    for row in table["rows"]:
        key = ", ".join(row[columns.index(c)] for c in spec.get("series", []))
        groups.setdefault(key, []).append(row)
    fig, ax = plt.subplots(figsize=(7, 4))
    ticks: set[float] = set()
    for key, rows in groups.items():
        for y in spec["y"]:
            points = [(number(r[xi]), number(r[columns.index(y)])) for r in rows]
            points = [(x, v) for x, v in points if x is not None and v is not None]
            label = ", ".join(part for part in (key, y if len(spec["y"]) > 1 else "") if part) or y
            xs, vs = zip(*points, strict=True) if points else ((), ())
            ticks.update(xs)
            if spec.get("kind", "line") == "bar":
                ax.bar([str(x) for x in xs], vs, label=label)
            else:
                ax.plot(xs, vs, marker="o", label=label.replace("`", ""))
    if spec.get("logx"):
        ax.set_xscale("log", base=2)
    if spec.get("kind", "line") == "line":
        ax.set_xticks(sorted(ticks), [f"{x:g}" for x in sorted(ticks)])
    ax.set_xlabel(spec.get("xlabel", spec["x"]))
    ax.set_ylabel(spec.get("ylabel", ", ".join(spec["y"])))
    ax.set_title(textwrap.fill(table["title"].replace("`", ""), 90), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=PAGE)
    parser.add_argument("--img", type=Path, default=IMG, help="plots go here; the page links them as img/<id>.png")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page on disk differs from the render")
    args = parser.parse_args(argv)
    tables = load(args.results)
    page = render(tables)
    if args.check:
        stale = not args.out.exists() or args.out.read_text() != page
        missing = [t["id"] for t in tables if "plot" in t and not (args.img / f"{t['id']}.png").exists()]
        if stale:
            print(f"{args.out} differs from {args.results}: run python -m benchmarks.report", file=sys.stderr)
        if missing:
            print(f"plots missing in {args.img}: {missing}", file=sys.stderr)
        return 1 if stale or missing else 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page)
    args.img.mkdir(parents=True, exist_ok=True)
    for table in tables:
        if "plot" in table:
            plot(table, args.img / f"{table['id']}.png")
    print(f"wrote {args.out} ({len(page.encode())} bytes) and {sum('plot' in t for t in tables)} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
