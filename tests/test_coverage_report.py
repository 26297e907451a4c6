"""``tests.coverage_report``: which lines count as CUDA-only (the ``# cuda-only`` comment, the whole-file list), how
a package's figure adds up, and that a measured process killed with SIGKILL still leaves what it ran (the
periodic save of ``tests/coverage_startup``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests import coverage_report as cr
from tests.conftest import ROOT

SOURCE = '''\
import torch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # cuda-only
    return device


if torch.cuda.is_available():
    x = 1
else:  # cuda-only: a block
    y = 2

    z = 3
w = 4


def graphs():  # cuda-only
    a = 1
    return a
'''


def test_a_marked_line_and_a_marked_block_are_cuda_only():
    assert cr.cuda_only_lines(SOURCE) == {6, 12, 13, 14, 15, 19, 20, 21}
    assert cr.cuda_only_lines("x = 1  # not CUDA only\ny = 2\n") == set()


def test_whole_files_are_cuda_only_and_exist():
    for rel in cr.CUDA_ONLY_FILES:
        assert (ROOT / rel).is_file(), rel
        assert cr.cuda_only(rel, (ROOT / rel).read_text()) is None
    worker = (ROOT / "actors/verifier/worker.py").read_text()
    gpu_import = next(i for i, line in enumerate(worker.splitlines(), 1) if "gpu_worker import" in line)
    assert gpu_import in cr.cuda_only("actors/verifier/worker.py", worker)


def test_a_figure_counts_cuda_only_lines_apart():
    total = cr.Figure()
    one = total.add(statements=set(range(1, 11)), missing={2, 3, 9}, cuda={9, 10, 42})
    assert (one.covered, one.measurable, one.cuda_only, one.cuda_ran) == (6, 8, 2, 1)
    whole = total.add(statements={1, 2, 3}, missing={3}, cuda=None)
    assert (whole.covered, whole.measurable, whole.cuda_only, whole.cuda_ran) == (0, 0, 3, 2)
    assert (total.covered, total.measurable, total.cuda_only, total.cuda_ran) == (6, 8, 5, 3)
    assert total.line() == "6 / 8 lines (75.0%); CUDA-only apart: 5 lines (3 of them ran here)"


def test_a_process_killed_with_sigkill_leaves_what_it_ran(tmp_path: Path):
    import coverage

    (tmp_path / "victim.py").write_text("def ran():\n    return 1\n\n\ndef never():\n    return 2\n")
    config = tmp_path / "coveragerc"
    config.write_text(f"[run]\nparallel = true\ndata_file = {tmp_path / '.coverage'}\nsource = {tmp_path}\n")
    env = dict(os.environ, COVERAGE_PROCESS_START=str(config), EAGLE_CLUSTER_COVERAGE_SAVE_S="0.2",
               PYTHONPATH=os.pathsep.join([str(cr.STARTUP), str(tmp_path)]))
    code = "import sys, time, victim; victim.ran(); print('ran', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ran\n"
        time.sleep(1.0)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    cov = coverage.Coverage(config_file=str(config))
    cov.combine(strict=True)
    _, statements, _, missing, _ = cov.analysis2(str(tmp_path / "victim.py"))
    assert 2 in statements and 2 not in missing  # ran()'s body, saved before the kill
    assert 6 in missing
