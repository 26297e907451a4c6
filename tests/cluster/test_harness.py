"""``cluster.harness.wait_ports_free`` names who holds a port; ``stop_ray`` ends the Ray sessions of one temporary
folder and everything under them, and leaves another folder's alone; ``ray_env`` names the server's own Ray. Real
processes stand in for Ray's (a "raylet" naming its session folder, with a child as a worker would be; a second
"raylet" of another folder): no Ray is started."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from cluster.harness import stop_ray, wait_ports_free

# A stand-in for a raylet: names its session folder in its arguments, as Ray's do; starts one child (a "worker",
# whose own arguments name nothing), prints the child's pid, then waits.
RAYLET = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
          " print(c.pid, flush=True); time.sleep(600)")


def start_raylet(session: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", RAYLET, f"--session-dir={session}"], stdout=subprocess.PIPE,
                            text=True)
    return proc, int(proc.stdout.readline())


def test_stop_ray_ends_one_folders_sessions_and_their_descendants_only(tmp_path):
    mine, other = tmp_path / "a" / "ray", tmp_path / "b" / "ray"
    mine.mkdir(parents=True)
    (mine / "ray_current_cluster").write_text("127.0.0.1:6379")  # what `ray start` leaves for ray.init() to join
    raylet, worker = start_raylet(f"{mine}/session_2026-12-07_1")
    kept, kept_worker = start_raylet(f"{other}/session_2026-12-07_2")
    try:
        ended = stop_ray(str(mine))
        assert raylet.pid in ended and worker in ended, ended
        assert raylet.wait(timeout=30) is not None
        deadline = time.monotonic() + 30
        while psutil.pid_exists(worker) and psutil.Process(worker).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the session's child outlived stop_ray"
            time.sleep(0.05)
        assert kept.poll() is None and psutil.pid_exists(kept_worker)  # the other folder's session runs on
        assert kept.pid not in ended and kept_worker not in ended
        assert not (mine / "ray_current_cluster").exists()  # as `ray stop` does: no dead cluster to join
        assert stop_ray(str(mine)) == []  # nothing left of that folder
    finally:
        for proc in (raylet, kept):
            for child in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else ():
                child.kill()
            proc.kill()
            proc.wait()


def test_wait_ports_free_names_who_holds_a_port_and_returns_once_it_is_free():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    with pytest.raises(RuntimeError, match=rf"ports \[{port}\] still in use .*{os.getpid()}"):
        wait_ports_free((port,), timeout_s=1)
    holder.close()
    wait_ports_free((port,), timeout_s=5)  # free again: returns


def test_end_session_ends_what_left_the_process_group_but_kept_the_session():
    """As a Ray worker does (a process group of its own, the server's session): ``killpg`` misses it, this does not."""
    from cluster.harness import end_session, session_processes

    code = ("import os, subprocess, sys; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
            " process_group=0); print(c.pid, flush=True); os._exit(0)")
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    worker = int(server.stdout.readline())
    server.wait()
    try:
        assert os.getpgid(worker) != server.pid and worker in session_processes(server.pid)
        assert worker in end_session(server.pid)
        assert session_processes(server.pid) == []
    finally:
        with contextlib.suppress(psutil.Error):
            psutil.Process(worker).kill()


def test_ray_env_reads_the_servers_own_ray_not_another_on_the_host():
    """A "raylet" carrying ``--gcs-address`` in the server's session, another Ray's outside it: ``ray_env`` names the
    server's (with its ``RAY_AUTH_MODE``), which ``"auto"`` would not tell apart from the other."""
    from cluster.harness import end_session, ray_env

    raylet = ("import os, subprocess, sys; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)',"
              " '--gcs-address={}'], env={{**os.environ, 'RAY_AUTH_MODE': 'token'}}); print(c.pid, flush=True);"
              " c.wait()")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "--gcs-address=10.0.0.9:7000"])
    server = subprocess.Popen([sys.executable, "-c", raylet.format("10.0.0.1:6000")], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        server.stdout.readline()
        assert ray_env(server) == {"RAY_ADDRESS": "10.0.0.1:6000", "RAY_AUTH_MODE": "token"}
        end_session(server.pid)
        server.wait()
        with pytest.raises(RuntimeError, match="no Ray cluster in the session"):
            ray_env(server, timeout_s=1)
    finally:
        other.kill()
        end_session(server.pid)
