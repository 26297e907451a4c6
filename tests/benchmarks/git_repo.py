"""Temporary git repositories for the tests of ``benchmarks.stamp``, ``benchmarks.staleness`` and
``benchmarks.report``: a repository, and commits that write files into it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

CONFIG = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *CONFIG, *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}).stdout.strip()


def commit(repo: Path, files: dict[str, str], message: str = "change", when: int | None = None) -> str:
    """Writes ``files`` (path: text), commits them, returns the commit's full hash. ``when``: its date (seconds;
    by default one second after the last one this helper made, so the order of commits is their order in time)."""
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", *files)
    count = int(git(repo, "rev-list", "--count", "--all"))
    date = f"{when if when is not None else 1_700_000_000 + count} +0000"
    git(repo, "commit", "-q", "-m", message, env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
    return git(repo, "rev-parse", "HEAD")


def new_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    """A repository at ``path`` with one commit of ``files`` (default: ``a.py``)."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    commit(path, files or {"a.py": "x = 1\n"}, "first")
    return path
