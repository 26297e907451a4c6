"""The suite's own guards: a hung test fails its run within the configured timeout (``pytest-timeout``, set in
``pyproject.toml``), and a test module that starts vLLM engines or Ray without ``pytest.mark.isolated`` is found
(``tests.run_isolated.unisolated_starters``; ``tests/conftest.py`` fails collection on it)."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib

import pytest

from tests import run_isolated
from tests.conftest import ROOT


def test_a_hung_test_fails_its_run_within_the_timeout(tmp_path):
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 60 <= options["timeout"] <= 1800 and options["timeout_method"] == "thread"
    hung = tmp_path / "test_hung.py"
    hung.write_text("import threading\n\n\ndef test_hangs():\n    threading.Event().wait()\n")
    start = time.monotonic()
    # The project's settings (its timeout method), the timeout itself shortened for the test.
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                           str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "timeout=2", str(hung)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout
    assert "Timeout" in done.stdout + done.stderr
    assert time.monotonic() - start < 120  # ended by the timeout, not by the wait


def test_what_starts_engines_or_ray_is_found(tmp_path):
    cases = {
        "ray": ("import ray\n\n\ndef test_a():\n    ray.init()\n", ["ray.init"]),
        "fixture": ("def test_a(ray_cluster):\n    pass\n", ["fixture ray_cluster"]),
        "engine": ("from actors.vllm_engine import make_llm\n\n\ndef test_a():\n    make_llm('m')\n", ["make_llm"]),
        "neither": ("def test_a():\n    assert sum([1, 2]) == 3\n", []),
    }
    for name, (source, found) in cases.items():
        path = tmp_path / f"test_{name}.py"
        path.write_text(source)
        assert run_isolated.starts_engines_or_ray(path) == found, name


def test_the_suite_isolates_every_module_that_starts_engines_or_ray(monkeypatch):
    modules = sorted((ROOT / "tests").rglob("test_*.py"))
    assert run_isolated.unisolated_starters(modules) == {}
    unmarked = "tests/actors/verifier/test_draft_validation.py"  # starts Ray; isolated in the suite
    isolated = [m for m in run_isolated.isolated_modules() if m != unmarked]
    monkeypatch.setattr(run_isolated, "isolated_modules", lambda: isolated)
    assert run_isolated.unisolated_starters(modules) == {unmarked: ["ray.init"]}


def test_two_lanes_keep_every_serve_module_in_one_lane_and_run_everything_once():
    isolated = run_isolated.isolated_modules()
    groups = run_isolated.groups_for([], isolated)
    engines, serve = run_isolated.lanes(groups, 2)
    rest = engines[0][1]
    assert rest[-1] == "tests" and all(f"--ignore={m}" in rest for m in isolated)  # the rest, first
    assert serve and all(name.startswith("tests/cluster/") for name, _ in serve)  # fixed ports: one at a time
    assert not any(name.startswith("tests/cluster/") for name, _ in engines[1:])
    assert sorted(name for name, _ in engines[1:] + serve) == sorted(isolated)
    (one,) = run_isolated.lanes(groups, 1)
    assert one == engines + serve


def test_lanes_option():
    assert run_isolated.parse_lanes(["-x", "--lanes", "1", "-k", "a"]) == (1, ["-x", "-k", "a"])
    assert run_isolated.parse_lanes(["--durations=20"]) == (1, ["--durations=20"])
    for bad in (["--lanes"], ["--lanes", "3"]):
        with pytest.raises(SystemExit, match="--lanes"):
            run_isolated.parse_lanes(bad)


def test_test_paths_run_alone_each_isolated_module_in_its_own_process():
    isolated = ["tests/a/test_engine.py", "tests/a/test_ray.py", "tests/b/test_serve.py"]
    assert [args for _, args in run_isolated.groups_for([], isolated)] == [
        ["--ignore=tests/a/test_engine.py", "--ignore=tests/a/test_ray.py", "--ignore=tests/b/test_serve.py", "tests"],
        ["tests/a/test_engine.py"], ["tests/a/test_ray.py"], ["tests/b/test_serve.py"]]
    assert [args for _, args in run_isolated.groups_for(["tests/a", "tests/b/test_serve.py::test_x"], isolated)] == [
        ["--ignore=tests/a/test_engine.py", "--ignore=tests/a/test_ray.py", "tests/a"],
        ["tests/a/test_engine.py"], ["tests/a/test_ray.py"], ["tests/b/test_serve.py::test_x"]]
    assert [args for _, args in run_isolated.groups_for(["tests/b/test_serve.py"], isolated)] == [
        ["tests/b/test_serve.py"]]
    assert run_isolated.is_test_path("tests/actors/test_messages.py::test_x")
    assert not run_isolated.is_test_path("--durations=20") and not run_isolated.is_test_path("not slow")
    assert not run_isolated.is_test_path("README.md")
