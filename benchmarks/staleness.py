"""Whether a results table still describes the code: stale once a commit after the one it measured touches one of
its ``sources``.

Where it sits: ``benchmarks.report`` asks it about every table in ``docs/results/`` and marks the stale ones on
``docs/BENCHMARKS.md`` and in README's Performance table. It reads git history only (``git log``), never the work
tree, so the answer depends on HEAD alone and a fresh clone renders what the committer rendered.

The rule, for a table's ``commit`` string (``"7644a78"``, ``"A, B: 7644a78; C: 430fa2c"``, ``"not recorded"``):

- every 7-40 hex-digit token in it is a commit the table measured; with none, it is stale (commit not recorded);
- a token that is no commit of HEAD's history makes it stale (in a shallow clone: cannot tell);
- it is stale when any measured commit has a later commit touching its ``sources``
  (``git log <commit>..HEAD -- <sources>``, merges left out);
- a table with ``rechecked`` (e.g. ``"every CI run"``) is re-measured by every run of the suite: never stale;
- where git cannot read the history (no git, not a checkout), staleness is unknown: its own state, ``UNKNOWN``.

The page names the first later commit (the oldest; the first of its paths within the sources; the measured commit
it follows), not how many there are: that line changes only when a table goes stale or is measured again, not with
every later commit, so the page needs no re-render after each commit (only after the one that first makes a
current table stale).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.stamp import git

HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
CURRENT, STALE, UNKNOWN = "current", "stale", "unknown"


@dataclass(frozen=True)
class Staleness:
    state: str  # CURRENT, STALE or UNKNOWN
    why: str = ""  # the page's line under the table's title ("" when current)


def measured_commits(commit: str) -> list[str]:
    """The commits a table's ``commit`` string names, in order, each once."""
    return list(dict.fromkeys(HEX.findall(commit)))


def on_head(repo: Path, token: str) -> bool:
    """Whether ``token`` is a commit HEAD descends from (a commit only on another branch, or only in someone's
    clone, is not: it would render differently elsewhere)."""
    full = git(repo, "rev-parse", "--verify", "--quiet", f"{token}^{{commit}}")
    return full is not None and git(repo, "merge-base", "--is-ancestor", full, "HEAD") is not None


def later_commits(repo: Path, since: str, sources: Sequence[str]) -> dict[str, tuple[int, str]]:
    """``{full hash: (commit time, first path touched within sources)}`` of the commits after ``since`` (on HEAD's
    history, not on ``since``'s) that touch ``sources``, merges left out."""
    out = git(repo, "log", "--no-merges", "--format=%x00%H %ct", "--name-only", f"{since}..HEAD", "--", *sources)
    found: dict[str, tuple[int, str]] = {}
    for block in (out or "").split("\0")[1:]:
        head, *paths = block.strip().splitlines()
        full, when = head.split()
        found[full] = (int(when), min(p for p in paths if p) if any(paths) else "")
    return found


def staleness(table: Mapping[str, Any], repo: Path) -> Staleness:
    """Whether ``table`` (a results JSON: ``commit``, ``sources``, maybe ``rechecked``) is current at HEAD."""
    if table.get("rechecked"):
        return Staleness(CURRENT)
    measured = measured_commits(table["commit"])
    if not measured:
        return Staleness(STALE, "**Stale**: commit not recorded.")
    if git(repo, "rev-parse", "HEAD") is None:
        return Staleness(UNKNOWN, "**Stale?** Cannot tell: no git history here.")
    missing = [c for c in measured if not on_head(repo, c)]
    if missing:
        if git(repo, "rev-parse", "--is-shallow-repository") == "true":
            return Staleness(UNKNOWN, f"**Stale?** Cannot tell: {', '.join(missing)} is not in this shallow clone.")
        return Staleness(STALE, f"**Stale**: measured at {', '.join(missing)}, not in HEAD's history.")
    later = {c: later_commits(repo, c, table["sources"]) for c in measured}
    firsts = [(when, full, i, path, c) for i, (c, found) in enumerate(later.items())
              for full, (when, path) in found.items()]
    if not firsts:
        return Staleness(CURRENT)
    _, full, _, path, since = min(firsts)
    return Staleness(STALE, f"**Stale**: sources changed after {since} ({full[:7]} {path}).")
