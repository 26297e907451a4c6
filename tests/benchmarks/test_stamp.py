"""``benchmarks.stamp``: the commit (short hash, a dirty tree said so, ``not recorded`` outside a checkout or without
git) on a temporary git repository, the date, the hardware sentence, and the machine's other busy processes (this
process's children never among them)."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import stamp
from tests.benchmarks.git_repo import git, new_repo


def a_repo(tmp_path: Path) -> Path:
    return new_repo(tmp_path / "repo")


def test_the_commit_is_heads_short_hash_and_a_dirty_tree_says_so(tmp_path: Path) -> None:
    repo = a_repo(tmp_path)
    head = git(repo, "rev-parse", "HEAD")
    clean = stamp.commit(repo)
    assert re.fullmatch(r"[0-9a-f]{7,40}", clean) and head.startswith(clean)
    (repo / "untracked.txt").write_text("not tracked: still clean\n")
    assert stamp.commit(repo) == clean
    (repo / "a.py").write_text("x = 2\n")
    assert stamp.commit(repo) == f"{clean} (dirty tree)"


def test_no_checkout_or_no_git_is_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert stamp.commit(tmp_path) == "not recorded"
    repo = a_repo(tmp_path)

    def no_git(*a: object, **kw: object) -> None:
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert stamp.commit(repo) == "not recorded"


def test_the_stamps_fields(tmp_path: Path) -> None:
    s = stamp.stamp("strict", root=a_repo(tmp_path), window_s=0.2)
    assert set(s) == {"commit", "date", "hardware", "others"}
    assert s["date"] == datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    assert re.search(r", \d+ cores; core 1: the drafter \(replica and actor\) alone", s["hardware"])
    assert stamp.hardware("the drafter alone").endswith("cores; the drafter alone")
    for other in s["others"]:
        assert set(other) == {"pid", "name", "cpu_pct"} and other["cpu_pct"] > 0
    assert json.loads(stamp.line(s).removeprefix("# stamp: ")) == s


def test_others_are_busy_processes_but_not_this_one_or_its_children() -> None:
    spin = "import time\nt = time.time()\nwhile time.time() - t < 5: pass\n"
    mine = subprocess.Popen([sys.executable, "-c", spin])
    try:
        busy = stamp.others(window_s=0.5, top=50)
    finally:
        mine.kill()
        mine.wait()
    assert busy is not None
    assert mine.pid not in {o["pid"] for o in busy}
    assert [o["cpu_pct"] for o in busy] == sorted((o["cpu_pct"] for o in busy), reverse=True)


def test_without_psutil_there_are_no_others(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)
    assert stamp.others(window_s=0) is None
    assert "others" not in stamp.stamp("none", root=tmp_path, window_s=0)
