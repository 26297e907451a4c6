"""``benchmarks.staleness`` on temporary git repositories: a table whose sources got a later commit is stale and its
line names the first one; one whose sources did not (other paths, docs/ only) is current; a commit not recorded, not
on HEAD's history or several of them; ``rechecked``; no git history (unknown) and a shallow clone."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.staleness import CURRENT, STALE, UNKNOWN, measured_commits, staleness
from tests.benchmarks.git_repo import commit, git, new_repo


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[str]]:
    """A repository and its commits, oldest first: src/ and other/ added; other/ changed; src/ changed; docs/."""
    repo = new_repo(tmp_path / "repo", {"src/a.py": "a = 1\n", "other/b.py": "b = 1\n"})
    first = git(repo, "rev-parse", "HEAD")
    other = commit(repo, {"other/b.py": "b = 2\n"}, "other")
    src = commit(repo, {"src/a.py": "a = 2\n", "src/z.py": "z = 1\n"}, "src")
    docs = commit(repo, {"docs/BENCHMARKS.md": "# the page\n", "README.md": "# readme\n"}, "the rendered page")
    return repo, [first, other, src, docs]


def table(commit: str, sources: list[str], **more: str) -> dict:
    return {"commit": commit, "sources": sources, **more}


def test_a_later_commit_on_its_sources_makes_a_table_stale(history: tuple[Path, list[str]]) -> None:
    repo, (first, other, src, _) = history
    s = staleness(table(first[:7], ["src"]), repo)
    assert s.state == STALE
    assert s.why == f"**Stale**: sources changed after {first[:7]} ({src[:7]} src/a.py)."
    s = staleness(table(first[:7], ["src", "other/b.py"]), repo)  # the first later commit of either
    assert s.why == f"**Stale**: sources changed after {first[:7]} ({other[:7]} other/b.py)."


def test_no_later_commit_on_its_sources_is_current(history: tuple[Path, list[str]]) -> None:
    repo, (_, other, src, docs) = history
    assert staleness(table(other[:7], ["other"]), repo).state == CURRENT  # src/ and docs/ changed since, not other/
    assert staleness(table(src, ["src", "other"]), repo).state == CURRENT  # only docs/ and README after: the page
    assert staleness(table(docs[:10], ["src"]), repo).state == CURRENT


def test_a_commit_not_recorded_or_not_on_heads_history_is_stale(history: tuple[Path, list[str]]) -> None:
    repo, (_, _, src, _) = history
    assert staleness(table("not recorded", ["src"]), repo).why == "**Stale**: commit not recorded."
    gone = staleness(table("deadbeef00", ["src"]), repo)
    assert gone.why == "**Stale**: measured at deadbeef00, not in HEAD's history."
    git(repo, "checkout", "-q", "-b", "side")
    side = commit(repo, {"other/b.py": "b = 3\n"}, "on a branch")
    git(repo, "checkout", "-q", "main")
    assert staleness(table(side[:7], ["src"]), repo).state == STALE  # it exists, but HEAD does not descend from it


def test_several_commits_any_with_later_changes_makes_it_stale(history: tuple[Path, list[str]]) -> None:
    repo, (first, _, src, docs) = history
    assert staleness(table(f"A, B: {src[:7]}; C: {docs[:7]}", ["src"]), repo).state == CURRENT
    s = staleness(table(f"A: {src[:7]}; C: {first[:7]}", ["src"]), repo)
    assert s.state == STALE and s.why.startswith(f"**Stale**: sources changed after {first[:7]} ")


def test_a_rechecked_table_is_never_stale(history: tuple[Path, list[str]]) -> None:
    repo, (first, *_) = history
    assert staleness(table(f"every commit (the GPU row: {first[:7]})", ["src"], rechecked="every CI run"),
                     repo).state == CURRENT


def test_without_git_history_or_in_a_shallow_clone_it_cannot_tell(history: tuple[Path, list[str]],
                                                                   tmp_path: Path) -> None:
    repo, (first, *_) = history
    nogit = tmp_path / "copy"
    nogit.mkdir()
    s = staleness(table(first[:7], ["src"]), nogit)
    assert s.state == UNKNOWN and s.why == "**Stale?** Cannot tell: no git history here."
    assert staleness(table("not recorded", ["src"]), nogit).state == STALE  # known without git
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    assert staleness(table(first[:7], ["src"]), shallow).state == UNKNOWN
    assert staleness(table(git(shallow, "rev-parse", "HEAD"), ["src"]), shallow).state == CURRENT


def test_the_commits_a_commit_string_names() -> None:
    assert measured_commits("A, B: 7644a78; C: 430fa2c") == ["7644a78", "430fa2c"]
    assert measured_commits("every commit (the GPU row: 0d3e5ea)") == ["0d3e5ea"]
    assert measured_commits("d6dfa57 (k = 0 row 1: 3fcd380; the first no-drafter run: b202d80, same wait unbound)") \
        == ["d6dfa57", "3fcd380", "b202d80"]
    assert measured_commits("b2cc616 plus the `cluster-eagle3-async` mode, b2cc616") == ["b2cc616"]
    assert measured_commits("not recorded") == [] and measured_commits("2026-12-03, abc12") == []
