"""Runs the suite with every module that starts vLLM engines or a Ray cluster in its own pytest process.

vLLM keeps process-global state (its distributed groups, the kernel registry) that a long sequence of engines
built and torn down in one process can leave inconsistent (seen here: "tensor model parallel group is not
initialized" in an engine built after many others); users run one engine per process, and so do these tests.

With ``--lanes 2`` the processes run in two lanes at once, each lane one process at a time: ``serve`` (the
modules under ``tests/cluster/``, which start Serve apps on fixed ports and so must not overlap each other) and
``engines`` (everything else: engines and drafter actors on a local Ray of their own, whose ports are chosen free, and
the modules that start neither). The ``engines`` lane has a Ray temporary folder of its own (``RAY_TMPDIR``): a
``ray.init()`` there must not find and join a cluster that a ``serve`` module started with ``ray start``; a ``serve``
module joins the Ray of the ``serve run`` it started by that server's own address (``cluster.harness.join_ray``),
never ``"auto"``, which can pick the other lane's. A module alone leaves a core idle about a third of the time; two
lanes fill it. Not the default: on a 2-core machine, a pipelined drafter starved by the other lane once missed the
verifier's 1 s step deadline (``test_greedy_exact_with_async_drafting``: a drafting failure, outputs still exact).
The default, ``--lanes 1``, runs one process at a time.

Each process's output is printed whole when it ends. Then each process's wall time, the slowest first, and one
closing line, ``total: N passed, N failed, N skipped``; exits non-zero if anything failed. ``--durations=20``
(passed through to pytest) names the slowest tests and fixtures inside each process.

Test paths among the arguments (files, folders or node ids under ``tests/``) run just those, grouped the same way
(the isolated modules among them each in their own process, the rest in one); without any, the whole suite.

    python -m tests.run_isolated [--lanes 1|2] [test paths...] [pytest args...]
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ISOLATED_MARK = "isolated"  # pyproject.toml's marker: a module that starts vLLM engines or a Ray cluster


def isolated_modules() -> list[str]:
    """The test modules whose module-level ``pytestmark`` includes ``pytest.mark.isolated``, by path."""
    out = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
                    and f"mark.{ISOLATED_MARK}" in ast.unparse(node.value)):
                out.append(str(path.relative_to(ROOT)))
    return out


# Calls that start a vLLM engine or a Ray cluster (their last dotted names), and the fixture that starts Ray.
STARTERS = {"ray.init", "serve.run", "make_llm", "make_verifier_llm", "LLM", "AsyncLLM.from_engine_args",
            "start_drafter_actor", "target_only", "remote_run", "Cluster"}
STARTER_FIXTURES = {"ray_cluster"}


def starts_engines_or_ray(path: Path) -> list[str]:
    """What in the test module ``path`` starts a vLLM engine or a Ray cluster, by reading it (calls in
    ``STARTERS``, test functions taking a fixture in ``STARTER_FIXTURES``); empty when nothing does. A static
    check: a helper that starts one out of sight is not seen."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in STARTERS or name.rsplit(".", 1)[-1] in STARTERS:
                found.add(name)
        elif isinstance(node, ast.FunctionDef):
            found |= {f"fixture {a.arg}" for a in node.args.args if a.arg in STARTER_FIXTURES}
    return sorted(found)


def unisolated_starters(paths: list[Path]) -> dict[str, list[str]]:
    """Test modules among ``paths`` that start engines or Ray without ``pytest.mark.isolated``, with what does."""
    isolated = set(isolated_modules())
    out = {}
    for path in paths:
        rel = str(path.resolve().relative_to(ROOT))
        if rel not in isolated and (starters := starts_engines_or_ray(path)):
            out[rel] = starters
    return out


SERVE_LANE = "tests/cluster/"  # modules that start Serve apps (fixed ports): never two at once


ENGINES_RAY_TMPDIR = "/tmp/ray-engines"  # the engines lane's Ray folder (short: Ray's socket paths live under it)


def is_test_path(arg: str) -> bool:
    """``arg`` names a test file, folder or node id (``file::test``) under ``tests/``, not a pytest option."""
    if arg.startswith("-"):
        return False
    path = (ROOT / arg.split("::", 1)[0]).resolve()
    return path.exists() and path.is_relative_to(ROOT / "tests")


def groups_for(paths: list[str], isolated: list[str]) -> list[tuple[str, list[str]]]:
    """(name, pytest arguments) of each process for ``paths`` (the whole suite when empty): first one process for
    what is not isolated (absent when nothing is), then one per isolated module (its node ids, when given)."""
    if not paths:
        return ([("tests (the rest, one process)", [f"--ignore={m}" for m in isolated] + ["tests"])]
                + [(m, [m]) for m in isolated])
    shared: list[str] = []
    own: dict[str, list[str]] = {}
    for arg in paths:
        file, sep, test = arg.partition("::")
        rel = str((ROOT / file).resolve().relative_to(ROOT))
        if rel in isolated:
            own.setdefault(rel, []).append(rel + sep + test)
            continue
        inside = [m for m in isolated if Path(m).is_relative_to(rel)]  # a folder's isolated modules
        for m in inside:
            own.setdefault(m, [m])
        shared += [f"--ignore={m}" for m in inside] + [rel + sep + test]
    named = [a for a in shared if not a.startswith("--ignore=")]
    out = [(f"{' '.join(named)} (one process)", shared)] if named else []
    return out + [(m, own[m]) for m in isolated if m in own]


def lanes(groups: list[tuple[str, list[str]]], count: int) -> list[list[tuple[str, list[str]]]]:
    """``groups`` (``groups_for``'s processes) split into ``count`` (1 or 2) lanes that run side by side, each in
    order: lane ``engines`` first (the process for what is not isolated, then its isolated modules), lane ``serve``
    the isolated modules under ``SERVE_LANE``."""
    serve = [g for g in groups if g[0].startswith(SERVE_LANE) and g[0].endswith(".py")]
    engines = [g for g in groups if g not in serve]
    return [engines + serve] if count == 1 else [engines, serve]


def run(args: list[str], extra: list[str], xml: Path, lock: threading.Lock, env: dict[str, str]) -> int:
    """One pytest process with ``env`` added to the environment; its output printed whole, under ``lock``, once it
    ends."""
    cmd = [sys.executable, "-m", "pytest", "-q", f"--junitxml={xml}", *args, *extra]
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, **env})
    with lock:
        print("$", " ".join(cmd[2:]), flush=True)
        print(done.stdout, end="", flush=True)
    return done.returncode


def counts(xml: Path) -> tuple[int, int, int]:
    if not xml.exists():
        return 0, 1, 0
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, fail, err, skip = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return tests - fail - err - skip, fail + err, skip


def parse_lanes(argv: list[str]) -> tuple[int, list[str]]:
    """(lanes, the pytest arguments): ``--lanes N`` (1 or 2, default 1) taken out of ``argv``."""
    args, count = list(argv), 1
    if "--lanes" in args:
        i = args.index("--lanes")
        value = args[i + 1] if i + 1 < len(args) else ""
        if value not in ("1", "2"):
            raise SystemExit(f"--lanes: 1 or 2, got {value!r}")
        count = int(value)
        del args[i:i + 2]
    return count, args


def main() -> int:
    count, args = parse_lanes(sys.argv[1:])
    paths = [a for a in args if is_test_path(a)]
    extra = [a for a in args if a not in paths]
    plan = lanes(groups_for(paths, isolated_modules()), count)
    results: list[tuple[float, str, int, tuple[int, int, int]]] = []
    lock = threading.Lock()
    start_all = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        def lane(n: int, groups: list[tuple[str, list[str]]]) -> None:
            env = {"RAY_TMPDIR": ENGINES_RAY_TMPDIR} if count == 2 and n == 0 else {}
            for i, (name, group) in enumerate(groups):
                xml = Path(tmp) / f"{n}-{i}.xml"
                start = time.monotonic()
                rc = run(group, extra, xml, lock, env)
                with lock:
                    results.append((time.monotonic() - start, name, rc, counts(xml)))

        threads = [threading.Thread(target=lane, args=(n, groups)) for n, groups in enumerate(plan)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for wall, name, _, _ in sorted(results, reverse=True):
        print(f"{wall:7.1f} s  {name}")
    print(f"{sum(r[0] for r in results):7.1f} s  in all, {time.monotonic() - start_all:.1f} s wall in {count} lane(s)")
    passed, failed, skipped = (sum(r[3][j] for r in results) for j in range(3))
    worst = any(rc not in (0, 5) for _, _, rc, _ in results)  # 5: no tests collected (e.g. everything deselected)
    print(f"total: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or worst else 0


if __name__ == "__main__":
    sys.exit(main())
