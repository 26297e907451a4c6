"""The vLLM plugin that sets the engine core's busy loop (``actors.engine_spin``): what it accepts, what it refuses
(with the variable's name), that vLLM's queues built after it use the value, and that vLLM finds it as a plugin."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from actors import engine_spin
from actors.engine_spin import MIN_SPIN_S, SPIN_ENV, parse_spin_s


@pytest.mark.parametrize("value", ["0", "0.002", "-1", "nan", "soon", ""])
def test_refused_values_name_the_variable(value):
    with pytest.raises(ValueError, match=SPIN_ENV):
        parse_spin_s(value)


def test_accepted_values():
    assert parse_spin_s(str(MIN_SPIN_S)) == MIN_SPIN_S
    assert parse_spin_s("0.02") == 0.02


def test_register_sets_the_busy_loop_while_steps_draft_and_the_plain_one_while_they_do_not(monkeypatch):
    import zmq
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    from vllm.utils.network_utils import get_open_zmq_ipc_path

    for name in ("drafting_s", "plain_s", "current"):
        monkeypatch.setattr(engine_spin._Spin, name, getattr(engine_spin._Spin, name))
    context = zmq.Context()
    try:
        monkeypatch.delenv(SPIN_ENV, raising=False)
        engine_spin.register()  # unset: vLLM's default stays, whatever the steps do
        engine_spin.drafting(True)
        assert SpinCondition(True, context, get_open_zmq_ipc_path()).busy_loop_s == 1
        monkeypatch.setenv(SPIN_ENV, "0.008")
        engine_spin.register()
        reader = SpinCondition(True, context, get_open_zmq_ipc_path())
        assert reader.busy_loop_s == 0.008
        engine_spin.drafting(False)  # a step without drafts: the plain loop, for queues built before too
        assert reader.busy_loop_s == 1  # vLLM's
        assert SpinCondition(True, context, get_open_zmq_ipc_path()).busy_loop_s == 1
        monkeypatch.setenv(engine_spin.PLAIN_SPIN_ENV, "0.05")
        engine_spin.register()
        engine_spin.drafting(False)
        assert reader.busy_loop_s == 0.05
        monkeypatch.setenv(engine_spin.PLAIN_SPIN_ENV, "0.001")  # below the floor: refused, named
        with pytest.raises(ValueError, match=engine_spin.PLAIN_SPIN_ENV):
            engine_spin.register()
        monkeypatch.delenv(engine_spin.PLAIN_SPIN_ENV)
        engine_spin.register()
        engine_spin.drafting(True)
        assert reader.busy_loop_s == 0.008
        monkeypatch.setenv(SPIN_ENV, "0")
        with pytest.raises(ValueError, match=SPIN_ENV):
            engine_spin.register()
    finally:
        context.destroy(linger=0)
        if "busy_loop_s" in SpinCondition.__dict__:
            del SpinCondition.busy_loop_s


def test_vllm_finds_the_plugin():
    names = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert names.get("eagle_cluster_engine_spin") == "actors.engine_spin:register"


def test_a_contended_wait_sleeps_on_the_wake_up_until_the_next_read(monkeypatch):
    """A turn whose ``sched_yield`` took ``CONTENDED_S`` (another process ran) makes the rest of that wait sleep on
    the writer's wake-up (``SLEEP_MS`` at most a turn), never spinning; the next read starts a new wait, which spins
    again; greedy (``EAGLE_CLUSTER_ENGINE_GREEDY_SPIN=1``) is vLLM's wait throughout."""
    import time
    from types import SimpleNamespace

    import zmq
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    from vllm.utils.network_utils import get_open_zmq_ipc_path

    clock = [0.0]  # the wait's perf_counter: a turn of vLLM's wait lasts what the test says, however busy the machine
    turns: list[float] = []
    calls: list[float] = []

    def vllm_wait(condition, timeout_ms=None):  # vLLM's turn, its sched_yield descheduled for `turns[-1]` s
        clock[0] += turns[-1]
        calls.append(turns[-1])

    for name in ("drafting_s", "greedy", "sharing", "current"):
        monkeypatch.setattr(engine_spin._Spin, name, getattr(engine_spin._Spin, name))
    engine_spin._Spin.drafting_s, engine_spin._Spin.greedy = 0.005, False
    engine_spin.drafting(False)  # a step without drafts: its waits share a contended core
    monkeypatch.setattr(SpinCondition, "busy_loop_s", property(engine_spin._busy_loop_s, engine_spin._ignore),
                        raising=False)
    monkeypatch.setattr(engine_spin, "time", SimpleNamespace(monotonic=time.monotonic, perf_counter=lambda: clock[0]))
    monkeypatch.setattr(engine_spin.os, "sched_getaffinity", lambda pid: {0, 1})
    wait = engine_spin._sharing_wait(vllm_wait)
    context = zmq.Context()
    try:
        path = get_open_zmq_ipc_path()
        writer = SpinCondition(False, context, path)
        reader = SpinCondition(True, context, path)
        while True:  # a PUB drops what it sends before the subscription reaches it: notify until one arrives
            writer.notify()
            if reader.local_notify_socket.poll(100):
                reader.local_notify_socket.recv()
                break
        turns.append(0.0)
        wait(reader)
        assert "_contended_after" not in reader.__dict__  # a quick yield: still spinning
        turns.append(engine_spin.CONTENDED_S * 4)
        wait(reader)
        assert reader._contended_after == reader.last_read  # contended: the rest of this wait sleeps
        spun = len(calls)
        wait(reader)  # no wake-up comes: sleeps SLEEP_MS on the socket, and returns
        writer.notify()
        assert reader.local_notify_socket.poll(10_000)  # the wake-up is there
        wait(reader)  # returns on it, and consumes it
        with pytest.raises(zmq.Again):
            reader.local_notify_socket.recv(flags=zmq.NOBLOCK)
        assert len(calls) == spun  # neither turn was vLLM's (a spin)
        reader.record_read()  # a read: the next wait spins again
        turns.append(0.0)
        wait(reader)
        assert len(calls) == spun + 1 and reader._contended_after != reader.last_read
        monkeypatch.setattr(engine_spin.os, "sched_getaffinity", lambda pid: {0})  # bound to one core
        turns.append(engine_spin.CONTENDED_S * 4)
        wait(reader)
        assert reader._contended_after != reader.last_read  # its yields go to its writer: keeps spinning
        monkeypatch.setattr(engine_spin.os, "sched_getaffinity", lambda pid: {0, 1})
        for greedy, drafts in ((False, True), (True, False)):  # a drafting step, or greedy: vLLM's wait
            engine_spin._Spin.greedy = greedy
            engine_spin.drafting(drafts)
            turns.append(engine_spin.CONTENDED_S * 4)
            wait(reader)
            assert reader._contended_after != reader.last_read  # nothing marked
    finally:
        context.destroy(linger=0)
