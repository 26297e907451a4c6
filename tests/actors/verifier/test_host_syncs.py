"""``actors.verifier.host_syncs.HostSyncs`` on the CPU: what counts as a readback, an upload or an asynchronous copy,
and that only this project's code is counted. The calls are made from a function compiled with a file name under
``actors/`` (a call site the counter attributes there); the same calls made from this test file count nothing."""

from __future__ import annotations

import torch

from actors.verifier.host_syncs import ACTORS, HostSyncs, SyncKind, is_device

STEP = """
def step(positions, rows, hidden):
    p = positions[rows.to(positions.device)]   # an upload (rows), a device tensor (p)
    host = p.cpu()                              # a readback
    n = rows.tolist()                           # host: nothing
    staging = torch.empty(hidden.shape, dtype=hidden.dtype)
    staging.copy_(hidden, non_blocking=True)    # an asynchronous copy
    total = int(positions.sum())                # a readback
    again = host.tolist()                       # host (the readback's result): nothing
    made = torch.zeros(3, device=positions.device)  # a device tensor
    off = hidden.to("cpu", non_blocking=True)   # an asynchronous copy to the host
    return made, off
"""


def compiled_in_actors():
    namespace = {"torch": torch}
    exec(compile(STEP, ACTORS + "verifier/_example_step.py", "exec"), namespace)
    return namespace["step"]


def test_the_worked_example_counts_uploads_readbacks_and_async_copies():
    step = compiled_in_actors()
    positions, hidden = torch.arange(10), torch.randn(10, 4)
    with HostSyncs() as syncs:
        syncs.mark(positions, hidden)
        made, off = step(positions, torch.tensor([1, 2]), hidden)
    got = [(e.kind, e.op.split(".")[-1], e.site.rsplit(":", 1)[1], e.nbytes) for e in syncs.events]
    assert got == [(SyncKind.UPLOAD, "to", "3", 16), (SyncKind.READBACK, "cpu", "4", 16),
                   (SyncKind.ASYNC, "copy_", "7", 160), (SyncKind.READBACK, "__int__", "8", 8),
                   (SyncKind.ASYNC, "to", "11", 160)]
    assert all(e.site.startswith("actors/verifier/_example_step.py:") for e in syncs.events)
    assert is_device(made) and not is_device(off) and is_device(hidden)


def test_a_boolean_mask_index_on_the_device_is_a_readback():
    mask_step = {"torch": torch}
    exec(compile("def pick(x):\n    return x[x > 2]\n", ACTORS + "verifier/_example_mask.py", "exec"), mask_step)
    with HostSyncs() as syncs:
        syncs.mark(x := torch.arange(5))
        picked = mask_step["pick"](x)
    assert [(e.kind, e.op.split(".")[-1]) for e in syncs.events] == [(SyncKind.READBACK, "__getitem__")]
    assert picked.tolist() == [3, 4] and is_device(picked)


def test_calls_made_outside_actors_are_not_counted():
    positions = torch.arange(4)
    with HostSyncs() as syncs:
        syncs.mark(positions)
        positions.cpu(), positions.tolist(), int(positions[0])
    assert syncs.events == []


def test_take_returns_the_events_and_starts_afresh():
    step = compiled_in_actors()
    with HostSyncs() as syncs:
        syncs.mark(positions := torch.arange(6), hidden := torch.zeros(6, 2))
        step(positions, torch.tensor([0]), hidden)
        first = syncs.take()
        assert syncs.events == [] and syncs.counts() == {}
        step(positions, torch.tensor([0]), hidden)
    assert len(first) == 5 and syncs.counts() == {SyncKind.UPLOAD: 1, SyncKind.READBACK: 2, SyncKind.ASYNC: 2}
