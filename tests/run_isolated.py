"""Runs the suite with every module that starts vLLM engines or a Ray cluster in its own pytest process.

vLLM keeps process-global state (its distributed groups, the kernel registry) that a long sequence of engines
built and torn down in one process can leave inconsistent (seen here: "tensor model parallel group is not
initialized" in an engine built after many others); users run one engine per process, and so do these tests.
Prints one closing line, ``total: N passed, N failed, N skipped``, and exits non-zero if anything failed.

    python -m tests.run_isolated [pytest args...]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ISOLATED = [
    "tests/actors/test_remote_verifier.py",
    "tests/actors/test_vllm_checkpoints.py",
    "tests/cluster/test_serve_app.py",
    "tests/cluster/test_ingress_serve.py",
    "tests/cluster/drafter_pool/test_pool_serve.py",
    "tests/cluster/test_multinode.py",
    "tests/cluster/test_serve_deploy.py",
    "tests/cluster/test_serve_multimodal.py",
    "tests/actors/test_remote_multimodal.py",
    "tests/cluster/test_cli_serve.py",
    "tests/actors/test_no_drafter_engine.py",
    "tests/cluster/test_drafter_outage_serve.py",
    "tests/actors/test_draft_length_engine.py",
]


def run(args: list[str], extra: list[str], xml: Path) -> int:
    cmd = [sys.executable, "-m", "pytest", "-q", f"--junitxml={xml}", *args, *extra]
    print("$", " ".join(cmd[2:]), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def counts(xml: Path) -> tuple[int, int, int]:
    if not xml.exists():
        return 0, 1, 0
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, fail, err, skip = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return tests - fail - err - skip, fail + err, skip


def main() -> int:
    extra = sys.argv[1:]
    groups = [[f"--ignore={m}" for m in ISOLATED] + ["tests"]] + [[m] for m in ISOLATED if (ROOT / m).exists()]
    passed = failed = skipped = 0
    worst = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, group in enumerate(groups):
            xml = Path(tmp) / f"{i}.xml"
            rc = run(group, extra, xml)
            p, f, s = counts(xml)
            passed, failed, skipped = passed + p, failed + f, skipped + s
            if rc not in (0, 5):  # 5: no tests collected (e.g. everything deselected)
                worst = rc or 1
    print(f"total: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or worst else 0


if __name__ == "__main__":
    sys.exit(main())
