"""The results page: ``docs/BENCHMARKS.md`` and its plots, and README's Performance table, rendered from the results
kept in ``docs/results/*.json``, each table marked where it is stale.

    python -m benchmarks.report            # writes docs/BENCHMARKS.md, docs/img/<table id>.png, README's table
    python -m benchmarks.report --check    # exit 1 if the page or README's table is not what the JSON renders (CI)

Where it sits: the benchmark modules (``benchmarks.served`` and the rest) measure and print, each with
``benchmarks.stamp``'s commit, date and hardware; the current figure of each thing a user asks about is kept, with
its command, hardware, date and commit, in one JSON file per table under ``docs/results/`` (files sorted by name give
the page's order; consecutive tables with the same ``question`` share a section). This module only renders them, so
a rerun updates a JSON file and then the page: ``benchmarks.served`` writes its tables in this format
(``table-NAME.json``: fill in ``question`` and ``notes``).

A table's JSON: ``id``, ``question``, ``title``, ``command``, ``hardware``, ``date``, ``commit``, ``sources``,
``notes``, and either ``columns`` + ``rows`` (cells are strings, copied as measured) or ``model`` (the GPU model
below: its inputs, assumptions and formulas are shown on the page and its rows are computed here, at render time).
``sources``: the paths (files or folders) whose code the table measures; none under ``docs/`` nor README, which this
module writes. Optional ``plot``: ``{"x": column, "y": [columns], "series": [columns], "kind": "line" | "bar",
"logx": bool, "xlabel", "ylabel"}``; optional ``rechecked`` (e.g. ``"every CI run"``): re-measured by the suite, so
never stale.
A column computed from others is named ``... (derived)`` and its notes say how; core 0's (``04-cpu-split``) are
recomputed at render (``core0_check``): an error where one does not follow, a flag in the notes where the ceiling
is below the measured tok/s.

Stale (``benchmarks.staleness``): a table is stale once a commit after its ``commit`` touches its ``sources``; the
page says so under its title and README's row says so in its ``measured`` cell. Where git cannot tell (no history
here, or a shallow clone without the measured commit), ``--check`` compares the page and README without their stale
marks: the figures are still checked, their staleness is left to a checkout with history (CI's clone has it).

README's rows are one file, ``docs/results/readme.json`` (``columns``, ``rows`` of ``{"table": id, "cells"}``), not
a key of each table: the README table has an order of its own (exactness first, the GPU drafter last) and its
``same`` cells refer to the row above, so its rows are kept together; each names the table whose staleness it
shows. The page's tables are written compactly (``|a|b|``) to keep it under 25 KB; README's keep its style.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.staleness import CURRENT, STALE, UNKNOWN, Staleness, staleness

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "BENCHMARKS.md"
IMG = ROOT / "docs" / "img"
README = ROOT / "README.md"
README_ROWS = "readme.json"  # in the results folder: README's Performance table, not a table of the page
REQUIRED = ("id", "question", "title", "command", "hardware", "date", "commit", "sources", "notes")
RENDERED = ("docs", "README.md")  # what this module writes (and the results it reads): never a table's source
BEGIN, END = "<!-- performance: rendered by python -m benchmarks.report -->", "<!-- /performance -->"

HEADER = """# Benchmarks

A CPU mode moves 10-25% between runs: compare ratios from one run. Rendered from `docs/results/*.json`
(`python -m benchmarks.report`); **Stale**: a later commit touches the table's `sources`.
"""


Table = dict[str, Any]


def check_sources(path: Path, sources: Any, repo: Path) -> None:
    """A table's ``sources``: a non-empty list of paths in ``repo`` (files or folders), none of them rendered here."""
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) and s for s in sources):
        raise ValueError(f"{path}: sources must be a non-empty list of repo-relative paths")
    for source in sources:
        parts = Path(source).parts
        if Path(source).is_absolute() or ".." in parts or parts[0] in RENDERED:
            raise ValueError(f"{path}: source {source!r} must be a path in the repository outside {RENDERED}")
        if not (repo / source).exists():
            raise ValueError(f"{path}: source {source!r} does not exist in {repo}")


def load(results: Path = RESULTS, repo: Path = ROOT) -> list[Table]:
    tables = []
    for path in sorted(results.glob("*.json")):
        if path.name == README_ROWS:
            continue
        table = json.loads(path.read_text())
        missing = [key for key in REQUIRED if key not in table]
        if missing:
            raise ValueError(f"{path}: missing {missing}")
        check_sources(path, table["sources"], repo)
        if "model" in table:
            table["columns"], table["rows"] = gpu_model(table["model"])
        for row in table["rows"]:
            if len(row) != len(table["columns"]):
                raise ValueError(f"{path}: row {row} has {len(row)} cells for {len(table['columns'])} columns")
        table["checked"] = core0_check(path, table)
        tables.append(table)
    return tables


# Core 0's derived columns (``04-cpu-split``): each follows from the measured ones, to their rounding.
CORE0, BUSY, CEILING = "core 0 ms/token (derived)", "core 0 busy (derived)", "ceiling tok/s (derived)"
CORE0_GROUPS = ("engine core ms/token", "worker ms/token", "serving path ms/token")


def core0_row(cells: Mapping[str, str]) -> bool:
    """Whether a row's derived core 0 cells follow from its measured ones (each shown rounded to its last digit)."""
    tps, core0 = float(cells["tok/s"]), float(cells[CORE0])
    busy, ceiling = float(cells[BUSY].rstrip("%")), float(cells[CEILING])
    lo, hi = core0 - 0.005, core0 + 0.005
    groups = [float(cells[g]) for g in CORE0_GROUPS if cells.get(g)]
    return (1000 / hi - 0.05 <= ceiling <= 1000 / lo + 0.05
            and lo * (tps - 0.05) / 10 - 0.5 <= busy <= hi * (tps + 0.05) / 10 + 0.5
            and (len(groups) < len(CORE0_GROUPS) or abs(sum(groups) - core0) <= 0.005 * (len(groups) + 1)))


def core0_check(path: Path, table: Table) -> str:
    """For a table with core 0's derived columns: an error where one does not follow from the measured columns, and
    a sentence for the notes naming the rows whose ceiling is below their measured tok/s (core 0 over 100% busy,
    which a pinned core cannot be: its CPU time is over-counted there). "" for other tables."""
    if not all(c in table["columns"] for c in ("tok/s", CORE0, BUSY, CEILING)):
        return ""
    below = []
    for row in table["rows"]:
        cells = dict(zip(table["columns"], row, strict=True))
        if not core0_row(cells):
            raise ValueError(f"{path}: row {row[:2]}: its derived columns do not follow from the measured ones")
        if float(cells[CEILING]) < float(cells["tok/s"]):
            below.append(f"{cells.get('mode', row[0])} at c = {cells.get('c', '?')}")
    return f"Flagged at render: ceiling < tok/s (core 0 over 100% busy) for {', '.join(below)}." if below else ""


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
    """README's style: ``| a | b |``."""
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]


def compact_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """The page's style, ``|a|b|`` (an empty cell ``| |``): the same table on GitHub in ~6% fewer bytes of page."""
    def line(values: Sequence[Any]) -> str:
        return "|" + "|".join(cell(v) or " " for v in values) + "|"

    return [line(columns), "|" + "---|" * len(columns)] + [line(row) for row in rows]


def render_table(table: Table, mark: Staleness | None = None) -> list[str]:
    out = [f"### {table['title']}", ""] + ([mark.why, ""] if mark and mark.why else [])
    out += ["```bash", table["command"], "```", ""]
    out += [f"**Hardware**: {table['hardware']}. **Date**, **commit**: {table['date']}, {table['commit']}.", ""]
    if "model" in table:
        model = table["model"]
        out += ["Inputs (measured):", ""]
        out += compact_table(["input", "value", "source"],
                              [[name, e["value"], e["source"]] for name, e in model["inputs"].items()])
        out += ["", "Assumptions:", ""] + [f"- {a}" for a in model["assumptions"]]
        out += ["", "Formulas (b: verifier batch; h: hit rate; d: draft step):", "", "```"]
        out += model["formulas"] + ["```", "", "Outputs (computed at render):", ""]
    notes = " ".join(n for n in (table["notes"], table.get("checked")) if n)
    out += compact_table(table["columns"], table["rows"]) + ["", notes, ""]
    if "plot" in table:
        out += [f"![{table['id']}](img/{table['id']}.png)", ""]
    return out


def render(tables: Sequence[Table], marks: Mapping[str, Staleness] | None = None) -> str:
    """The page; ``marks``: each table's staleness by id (none given: every table current)."""
    out = [HEADER]
    question = None
    for table in tables:
        if table["question"] != question:
            question = table["question"]
            out += [f"## {question}", ""]
        out += render_table(table, (marks or {}).get(table["id"]))
    return "\n".join(out).rstrip() + "\n"


# README's Performance table ------------------------------------------------------------------------------------
README_MARKS = {STALE: " (**stale**)", UNKNOWN: " (stale?)"}
MARKED = re.compile(r"^\*\*Stale.*\n\n|" + "|".join(re.escape(m) for m in README_MARKS.values()), re.MULTILINE)


def load_readme(results: Path, tables: Sequence[Table]) -> dict[str, Any] | None:
    """README's rows (``readme.json``: ``columns``, ``rows`` of ``{"table": id, "cells": [...]}``), each row naming
    the table it summarises; None where the results folder has none."""
    path = results / README_ROWS
    if not path.exists():
        return None
    readme = json.loads(path.read_text())
    ids = {t["id"] for t in tables}
    for row in readme["rows"]:
        if row["table"] not in ids:
            raise ValueError(f"{path}: row {row['cells'][0]!r} names table {row['table']!r}, which is not in {results}")
        if len(row["cells"]) != len(readme["columns"]):
            raise ValueError(f"{path}: row {row['cells'][0]!r} has {len(row['cells'])} cells for "
                             f"{len(readme['columns'])} columns")
    return readme


def readme_block(readme: Mapping[str, Any], marks: Mapping[str, Staleness]) -> str:
    """The table between README's markers; the last cell (``measured``) of a stale table's row says so."""
    rows = [[*r["cells"][:-1], r["cells"][-1] + README_MARKS.get(marks[r["table"]].state, "")] for r in readme["rows"]]
    return "\n".join([BEGIN, "", *markdown_table(readme["columns"], rows), "", END])


def splice(text: str, block: str, where: Path) -> str:
    """``text`` with what lies between the markers (both included) replaced by ``block``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{where}: no {BEGIN} ... {END} to render README's Performance table into")
    return text[:start] + block + text[end + len(END):]


def unmarked(text: str) -> str:
    """``text`` without its stale marks: what ``--check`` compares where git cannot tell which tables are stale."""
    return MARKED.sub("", text)


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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path, default=PAGE)
    p.add_argument("--img", type=Path, default=IMG, help="plots go here; the page links them as img/<id>.png")
    p.add_argument("--readme", type=Path, default=README, help=f"its Performance table, from {README_ROWS}")
    p.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose history says which tables are stale")
    p.add_argument("--check", action="store_true", help="exit 1 if the page or README differs from the render")
    return p


def differs(path: Path, rendered: str, marks_known: bool) -> bool:
    """Whether ``path`` is not what was rendered; where staleness is unknown, its marks are left out of it."""
    if not path.exists():
        return True
    on_disk = path.read_text()
    return on_disk != rendered if marks_known else unmarked(on_disk) != unmarked(rendered)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    tables = load(args.results, args.repo)
    marks = {t["id"]: staleness(t, args.repo) for t in tables}
    page = render(tables, marks)
    readme_rows = load_readme(args.results, tables)
    readme = splice(args.readme.read_text(), readme_block(readme_rows, marks), args.readme) if readme_rows else None
    if args.check:
        known = all(m.state != UNKNOWN for m in marks.values())
        if not known:
            print("git cannot tell which tables are stale here: checking all but the stale marks", file=sys.stderr)
        behind = [path for path, text in ((args.out, page), (args.readme, readme))
                  if text is not None and differs(path, text, known)]
        missing = [t["id"] for t in tables if "plot" in t and not (args.img / f"{t['id']}.png").exists()]
        for path in behind:
            print(f"{path} differs from {args.results}: run python -m benchmarks.report", file=sys.stderr)
        if missing:
            print(f"plots missing in {args.img}: {missing}", file=sys.stderr)
        return 1 if behind or missing else 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page)
    if readme is not None:
        args.readme.write_text(readme)
    args.img.mkdir(parents=True, exist_ok=True)
    for table in tables:
        if "plot" in table:
            plot(table, args.img / f"{table['id']}.png")
    stale = sorted(t for t, m in marks.items() if m.state != CURRENT)
    print(f"wrote {args.out} ({len(page.encode())} bytes){f', {args.readme}' if readme else ''} and "
          f"{sum('plot' in t for t in tables)} plots; stale or unknown: {stale or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
