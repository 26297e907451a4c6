"""``benchmarks.report``: the results page rendered from JSON (a table, its plot, its stale mark, ``--check``), the
sources a table must name, README's Performance table rendered between its markers, ``--check`` where git cannot tell
which tables are stale, core 0's derived columns checked, the GPU model's arithmetic on inputs that can be checked by
hand, the repo's own ``docs/BENCHMARKS.md`` and README kept in step with ``docs/results``, and every citation of a
section of the page naming one it has. No Ray, no vLLM, no server."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from benchmarks import report
from tests.benchmarks.git_repo import commit, new_repo

TABLE = {
    "id": "tiny", "question": "Is it fast?", "title": "A tiny table", "command": "python -m benchmarks.tiny --c 1 2",
    "hardware": "core 0 for the verifier, core 1 for the drafter", "date": "2026-12-05", "commit": "abc1234",
    "sources": ["bench.py"], "columns": ["c", "tok/s", "ratio"],
    "rows": [["1", "10.5", "0.50x"], ["2", "20.0", "1.00x"]],
    "notes": "What it shows.", "plot": {"x": "c", "y": ["tok/s"], "kind": "line", "ylabel": "tok/s"},
}

# Inputs whose outputs are worked out by hand below: a layer costs 1 ms for 1 token, 2 ms for 4, 4 ms for 8; 4
# layers over TP 2 make a step 2x a layer.
INPUTS = {
    "layer_ms_by_tokens": {"1": 1.0, "4": 2.0, "8": 4.0}, "layers": 4, "tp": 2, "k": 3,
    "seed_step_ms": 16.0, "seed_batch": 1,
    "draft_ms_by_batch": {"1": 1.0, "3": 3.0}, "miss_ms_by_batch": {"1": 3.0}, "branch_ms_by_batch": {"1": 6.0},
    "call_waited_ms": 0.5, "call_submit_ms": 0.1, "ready_get_ms": 0.05,
    "mal_sync": 2.0, "mal_pipelined": 1.5, "hit_rate_by_batch": {"1": 1.0},
}


def write_results(directory: Path, *tables: dict) -> Path:
    directory.mkdir()
    for i, table in enumerate(tables):
        (directory / f"{i:02d}-{table['id']}.json").write_text(json.dumps(table))
    return directory


def a_checkout(tmp_path: Path) -> tuple[Path, str]:
    """A repository holding ``bench.py`` (the tiny table's source) and its commit's short hash."""
    repo = new_repo(tmp_path / "repo", {"bench.py": "fast = True\n"})
    return repo, commit(repo, {"other.py": "x = 1\n"}, "not the table's source")[:7]


def test_a_tiny_table_renders_with_its_plot_and_check_follows_the_page(tmp_path: Path) -> None:
    repo, head = a_checkout(tmp_path)
    results = write_results(tmp_path / "results", {**TABLE, "commit": head})
    page, img = tmp_path / "docs" / "BENCHMARKS.md", tmp_path / "docs" / "img"
    args = ["--results", str(results), "--out", str(page), "--img", str(img), "--repo", str(repo)]
    assert report.main(args) == 0
    text = page.read_text()
    assert "## Is it fast?" in text and "### A tiny table\n\n```bash\npython -m benchmarks.tiny --c 1 2\n```" in text
    assert f"**Date**, **commit**: 2026-12-05, {head}." in text and "core 0 for the verifier" in text
    assert "|c|tok/s|ratio|\n|---|---|---|\n|1|10.5|0.50x|\n|2|20.0|1.00x|" in text
    assert "![tiny](img/tiny.png)" in text
    assert (img / "tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.main([*args, "--check"]) == 0
    page.write_text(text.replace("10.5", "11.5"))
    assert report.main([*args, "--check"]) == 1
    (img / "tiny.png").unlink()
    page.write_text(text)
    assert report.main([*args, "--check"]) == 1  # the page is current but its plot is gone


def test_a_stale_table_says_so_under_its_title_and_check_follows_its_sources(tmp_path: Path) -> None:
    repo, head = a_checkout(tmp_path)
    results = write_results(tmp_path / "results", {**TABLE, "commit": head})
    page, img = tmp_path / "BENCHMARKS.md", tmp_path / "img"
    args = ["--results", str(results), "--out", str(page), "--img", str(img), "--repo", str(repo)]
    assert report.main(args) == 0 and "Stale" not in page.read_text().split("\n## ", 1)[1]
    later = commit(repo, {"bench.py": "fast = False\n"}, "the source changes")
    assert report.main([*args, "--check"]) == 1  # the page says current; at HEAD the table is stale
    assert report.main(args) == 0
    line = f"**Stale**: sources changed after {head} ({later[:7]} bench.py)."
    assert f"### A tiny table\n\n{line}\n\n```bash" in page.read_text()
    commit(repo, {"bench.py": "fast = None\n"}, "another change: the page names the first, so it still holds")
    assert report.main([*args, "--check"]) == 0


def test_where_git_cannot_tell_check_compares_all_but_the_stale_marks(tmp_path: Path) -> None:
    repo, head = a_checkout(tmp_path)
    results = write_results(tmp_path / "results", {**TABLE, "commit": head})
    commit(repo, {"bench.py": "fast = False\n"})
    page, img = tmp_path / "BENCHMARKS.md", tmp_path / "img"
    args = ["--results", str(results), "--out", str(page), "--img", str(img)]
    assert report.main([*args, "--repo", str(repo)]) == 0 and "**Stale**: " in page.read_text()
    copy = tmp_path / "copy"  # the same files, no history
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    assert report.main([*args, "--repo", str(copy), "--check"]) == 0
    page.write_text(page.read_text().replace("10.5", "11.5"))
    assert report.main([*args, "--repo", str(copy), "--check"]) == 1


@pytest.mark.parametrize(("sources", "says"), [
    (None, "missing ['sources']"), ([], "non-empty list"), (["docs/results"], "outside"), (["README.md"], "outside"),
    (["../bench.py"], "outside"), (["nothing.py"], "'nothing.py' does not exist"),
])
def test_a_table_must_name_its_sources(tmp_path: Path, sources: list[str] | None, says: str) -> None:
    repo, _ = a_checkout(tmp_path)
    (repo / "docs" / "results").mkdir(parents=True)
    (repo / "README.md").write_text("# readme\n")
    bad = {k: v for k, v in TABLE.items() if k != "sources"} | ({"sources": sources} if sources is not None else {})
    results = write_results(tmp_path / "results", bad)
    with pytest.raises(ValueError, match=re.escape(says)) as e:
        report.load(results, repo)
    assert "00-tiny.json" in str(e.value)


README_TEXT = """# A project

## Performance

Hand-written words.

{begin}
old table
{end}

More words.
"""
README_ROWS = {"columns": ["question", "answer", "measured"], "rows": [
    {"table": "tiny", "cells": ["fast?", "**10.5** tok/s", "2026-12-05, `abc1234`"]},
    {"table": "tiny", "cells": ["at c = 2?", "20.0 tok/s", "same"]}]}


def test_readmes_table_is_rendered_between_its_markers_with_stale_marks(tmp_path: Path) -> None:
    repo, head = a_checkout(tmp_path)
    results = write_results(tmp_path / "results", {**TABLE, "commit": head})
    (results / report.README_ROWS).write_text(json.dumps(README_ROWS))
    readme = tmp_path / "README.md"
    readme.write_text(README_TEXT.format(begin=report.BEGIN, end=report.END))
    args = ["--results", str(results), "--out", str(tmp_path / "B.md"), "--img", str(tmp_path / "img"),
            "--readme", str(readme), "--repo", str(repo)]
    assert report.main(args) == 0
    table = ("| question | answer | measured |\n| --- | --- | --- |\n"
             "| fast? | **10.5** tok/s | 2026-12-05, `abc1234` |\n| at c = 2? | 20.0 tok/s | same |")
    rendered = README_TEXT.format(begin=report.BEGIN, end=report.END).replace("old table", f"\n{table}\n")
    assert readme.read_text() == rendered
    assert report.main([*args, "--check"]) == 0
    readme.write_text(readme.read_text().replace("20.0 tok/s", "21.0 tok/s"))  # a hand edit
    assert report.main([*args, "--check"]) == 1
    commit(repo, {"bench.py": "fast = False\n"})
    assert report.main(args) == 0
    text = readme.read_text()
    assert "| 2026-12-05, `abc1234` (**stale**) |" in text and "| same (**stale**) |" in text
    assert "20.0 tok/s" in text and report.main([*args, "--check"]) == 0
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="no <!-- performance"):
        report.main(args)


def test_a_readme_row_must_name_a_table(tmp_path: Path) -> None:
    repo, _ = a_checkout(tmp_path)
    results = write_results(tmp_path / "results", TABLE)
    (results / report.README_ROWS).write_text(json.dumps(
        {"columns": ["question"], "rows": [{"table": "elsewhere", "cells": ["fast?"]}]}))
    with pytest.raises(ValueError, match="names table 'elsewhere'"):
        report.load_readme(results, report.load(results, repo))


CPU_COLUMNS = ["mode", "c", "tok/s", "engine core ms/token", "worker ms/token", "serving path ms/token",
               report.CORE0, report.BUSY, report.CEILING]


def test_core_0s_derived_columns_are_checked_and_a_ceiling_below_tok_s_flagged(tmp_path: Path) -> None:
    rows = [["cluster", "1", "83.5", "1.95", "7.04", "0.84", "9.83", "82%", "101.7"],
            ["colocated", "8", "501.2", "0.15", "1.74", "0.14", "2.03", "102%", "493.5"]]
    cpu = {**TABLE, "columns": CPU_COLUMNS, "rows": rows}
    assert report.core0_check(Path("t.json"), cpu) == (
        "Flagged at render: ceiling < tok/s (core 0 over 100% busy) for colocated at c = 8.")
    assert report.core0_check(Path("t.json"), {**cpu, "rows": rows[:1]}) == ""
    assert report.core0_check(Path("t.json"), TABLE) == ""  # not a table of core 0's columns
    for i, wrong in ((8, "110.0"), (7, "90%"), (6, "9.90")):  # the ceiling, the busy share, the sum of the groups
        with pytest.raises(ValueError, match="t.json: row"):
            report.core0_check(Path("t.json"), {**cpu, "rows": [rows[0][:i] + [wrong] + rows[0][i + 1:]]})


def test_a_row_of_the_wrong_width_is_refused(tmp_path: Path) -> None:
    repo, _ = a_checkout(tmp_path)
    results = write_results(tmp_path / "results", {**TABLE, "rows": [["1", "10.5"]]})
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        report.load(results, repo)


def test_interpolation_between_and_outside_the_measured_points() -> None:
    points = {"1": 1.0, "4": 2.0, "8": 4.0}
    assert report.interpolate(points, 4) == 2.0
    assert report.interpolate(points, 6) == pytest.approx(3.0)
    assert report.interpolate(points, 0.5) == 1.0 and report.interpolate(points, 64) == 4.0
    rates = {"1": 0.6, "8": 0.4, "16": 0.5}
    assert report.at_or_below(rates, 4) == 0.6 and report.at_or_below(rates, 64) == 0.5


def test_the_model_at_batch_1_by_hand() -> None:
    s = report.model_steps(INPUTS, 1, 1.0)
    assert s["target"] == pytest.approx(2.0)  # L(1) = 1 ms, x 4 layers / TP 2
    assert s["verify"] == pytest.approx(4.0)  # L(1 x (k + 1) = 4) = 2 ms, x 2
    assert s["target_tps"] == pytest.approx(500.0)
    assert s["sync"] == pytest.approx(4.0 + 0.5 + 1.0)  # verify + a waited call + the draft step
    assert s["sync_tps"] == pytest.approx(1000 * 2.0 / 5.5)
    # hit rate 1: max(verify, the drafter's branch work) + two submits + reading the ready table
    assert s["pipelined"] == pytest.approx(max(4.0, 6.0) + 2 * 0.1 + 0.05)
    assert s["pipelined_tps"] == pytest.approx(1000 * 1.5 / 6.25)
    assert s["verifiers"] == pytest.approx(4.0 / 1.0)


def test_the_model_with_no_hits_and_at_a_larger_batch() -> None:
    s = report.model_steps({**INPUTS, "hit_rate_by_batch": {"1": 0.0}}, 1, 1.0)
    assert s["pipelined"] == pytest.approx(4.0 + 0.5 + 0.1 + 3.0)  # verify + waited call + a submit + the miss
    half = report.model_steps({**INPUTS, "hit_rate_by_batch": {"1": 0.5}}, 1, 1.0)
    assert half["pipelined"] == pytest.approx(0.5 * 6.25 + 0.5 * 7.6)
    s = report.model_steps(INPUTS, 2, 1.0)
    assert s["verify"] == pytest.approx(8.0)  # 2 x 4 = 8 tokens: L = 4 ms
    assert s["draft"] == pytest.approx(2.0)  # halfway between batch 1 (1 ms) and 3 (3 ms)
    assert s["target_tps"] == pytest.approx(750.0)  # L(2) = 1 + 1/3 ms a layer (a third of the way to 4 tokens), x 2


def test_seed_scaling_sets_the_seed_batch_verify_step_to_the_seed_step() -> None:
    scale = report.seed_scale(INPUTS)
    assert scale == pytest.approx(16.0 / 4.0)
    assert report.model_steps(INPUTS, 1, scale)["verify"] == pytest.approx(16.0)


def test_the_model_table_is_computed_from_its_inputs() -> None:
    model = {"batches": [1, 2], "inputs": {name: {"value": v, "source": "by hand"} for name, v in INPUTS.items()}}
    columns, rows = report.gpu_model(model)
    assert [r[:2] for r in rows] == [["proxy", "1"], ["proxy", "2"], ["seed-scaled", "1"], ["seed-scaled", "2"]]
    first = dict(zip(columns, rows[0], strict=True))
    assert first["verify ms"] == "4.00" and first["target-only tok/s"] == "500" and first["R"] == "4.0"
    assert first["sync x target-only"] == f"{1000 * 2.0 / 5.5 / 500:.2f}"


def test_the_repos_page_is_what_its_results_render() -> None:
    assert report.main(["--check"]) == 0, "docs/BENCHMARKS.md or README is stale: run python -m benchmarks.report"
    assert len(report.PAGE.read_bytes()) <= 25_000


# `docs/BENCHMARKS.md`, "A heading" (or docs/BENCHMARKS.md, issue 23): a section of the page cited; not a past
# version of it (`git show REV:docs/BENCHMARKS.md`, ...).
CITATION = re.compile(r"(?<![:\w/])(?:docs/)?BENCHMARKS\.md`?,\s*([^)]*)")
CITING = ["README.md", "docs/ARCHITECTURE.md", *(f"deploy/{p.name}" for p in (report.ROOT / "deploy").glob("*.yaml"))]


def test_every_citation_of_a_section_of_the_page_names_one_it_has() -> None:
    headings = {line.lstrip("#").strip() for line in report.PAGE.read_text().splitlines() if line.startswith("#")}
    cited = [(path, m.group(1).strip()) for path in CITING
             for m in CITATION.finditer((report.ROOT / path).read_text())]
    assert cited, "no citation found: the pattern is wrong"
    bad = [(path, what) for path, what in cited
           if not (what.startswith('"') and what[1:].split('"')[0] in headings)]
    assert not bad, f"citations of docs/BENCHMARKS.md naming no heading of it: {bad}"
