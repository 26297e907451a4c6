"""The host syncs a verifier step makes in this project's code, counted on any device: ``HostSyncs``.

Where it sits: around the driver worker's step in the tests, never in a served step. On a GPU
a *readback* (``.cpu()``, ``.item()``, ``.tolist()``, ``.numpy()``, ``bool(t)`` / ``int(t)`` / ``float(t)``, a
blocking ``copy_`` into host memory, or an op whose output size depends on the data: ``nonzero``,
``repeat_interleave`` by a tensor, a boolean-mask index) stops the host until the device has caught up, and an
*upload* (``.to(device)`` / a blocking ``copy_`` from host memory) from pageable memory stops it too;
``torch.cuda.set_sync_debug_mode("warn")`` reports those there. On the CPU nothing stops and every tensor is on the
one device, so this ``TorchFunctionMode`` keeps the distinction itself:

- a *device tensor* is one ``mark``ed so (what vLLM hands the proposer on its device), one computed from a device
  tensor, one made with an explicit ``device=`` argument, or one a ``.to(device)`` / ``copy_`` made or wrote;
- everything else is a host tensor (this project's host-side bookkeeping is numpy, or torch without ``device=``);
  ``.to("cpu")`` (the string, as this project writes a move to the host) makes one.

A call counts when the frame that made it is in ``actors/`` (vLLM's own syncs are vLLM's: target-only makes them
too), as a ``Sync`` with its kind, call site and bytes. ``non_blocking=True`` copies count apart (``ASYNC``): they
start a transfer without waiting for it.

Worked example: ``positions`` marked, ``rows`` a host tensor -> ``positions[rows.to(dev)]`` is one ``UPLOAD`` (rows)
and a device tensor; its ``.cpu()`` one ``READBACK``; ``rows.tolist()`` nothing (host).
"""

from __future__ import annotations

import enum
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

ACTORS = str(Path(__file__).resolve().parents[1]) + "/"  # this project's actors/
_HERE = str(Path(__file__).resolve())
_TORCH = str(Path(torch.__file__).resolve().parent) + "/"
_TAG = "_eagle_on_device"

T = torch.Tensor
_READBACKS = {T.cpu, T.item, T.tolist, T.numpy, T.__bool__, T.__int__, T.__float__, T.__index__, T.nonzero,
              torch.nonzero, T.masked_select, torch.masked_select, T.unique, torch.unique}
_SIZED_BY_DATA = {T.repeat_interleave, torch.repeat_interleave}  # a readback when the repeats are a device tensor
_INPLACE = {T.__setitem__, T.index_put_, T.masked_fill_, T.fill_, T.zero_, T.scatter_, T.index_copy_}


class SyncKind(enum.Enum):
    READBACK = "readback"  # device to host, waited for
    UPLOAD = "upload"  # host to device, blocking (pageable)
    ASYNC = "async"  # a non_blocking copy either way: started, not waited for


@dataclass(frozen=True)
class Sync:
    kind: SyncKind
    op: str  # e.g. "Tensor.cpu"
    site: str  # "actors/verifier/step_rows.py:51"
    nbytes: int


def is_device(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _TAG, False)


def _tag(t: Any) -> None:
    if isinstance(t, torch.Tensor):
        setattr(t, _TAG, True)


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if isinstance(t, torch.Tensor) else 0


def _caller() -> str | None:
    """``actors/...py:LINE`` of the first frame outside torch and this module, if it is in ``actors/``."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_TORCH) or name == _HERE):
            return f"actors/{name[len(ACTORS):]}:{frame.f_lineno}" if name.startswith(ACTORS) else None
        frame = frame.f_back
    return None


class HostSyncs(TorchFunctionMode):
    """Counts this project's host syncs while active (``with HostSyncs() as syncs:``); ``mark`` the device tensors
    first. ``syncs.events``: every ``Sync`` in order; ``take()`` returns them and starts afresh (one step's)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Sync] = []

    @staticmethod
    def mark(*tensors: Any) -> None:
        """Marks ``tensors`` (and the tensors inside lists, tuples or dicts among them) as device tensors."""
        for t in tree_leaves(list(tensors)):
            _tag(t)

    def take(self) -> list[Sync]:
        events, self.events = self.events, []
        return events

    def counts(self) -> Counter[SyncKind]:
        return Counter(e.kind for e in self.events)

    def _count(self, kind: SyncKind, func: Any, nbytes: int) -> None:
        site = _caller()
        if site is not None:
            self.events.append(Sync(kind, getattr(func, "__qualname__", str(func)), site, nbytes))

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        on_device = any(is_device(x) for x in leaves)
        non_blocking = bool(kwargs.get("non_blocking", False))
        out = func(*args, **kwargs)
        if func in _READBACKS:
            if on_device:
                self._count(SyncKind.READBACK, func, _nbytes(args[0]) if args else 0)
                if func is T.cpu:  # on the CPU .cpu() hands back its input: the host copy must be another tensor
                    return out.view_as(out) if out is args[0] else out
                if isinstance(out, torch.Tensor):  # nonzero, unique, masked_select: a device tensor, sized on the host
                    _tag(out)
            return out
        if func in _SIZED_BY_DATA and len(args) > 1 and is_device(args[1]):
            self._count(SyncKind.READBACK, func, _nbytes(args[1]))
        elif func is T.__getitem__ and on_device and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in tree_leaves(list(args[1:]))):
            self._count(SyncKind.READBACK, func, 0)  # a boolean mask: the output's size is read back
        elif func is T.to and args and _names_host(args[1:], kwargs):  # device -> host
            if on_device:
                self._count(SyncKind.ASYNC if non_blocking else SyncKind.READBACK, func, _nbytes(args[0]))
                return out.view_as(out) if out is args[0] else out  # the host copy: another tensor, not marked
            return out
        elif func is T.to and args and _names_device(args[1:], kwargs):
            if not on_device:  # host -> device
                self._count(SyncKind.ASYNC if non_blocking else SyncKind.UPLOAD, func, _nbytes(args[0]))
                if out is args[0]:  # on the CPU .to() hands back its input: the device copy must be another tensor
                    out = out.view_as(out)
            _tag(out)
            return out
        elif func is T.copy_ and len(args) > 1:
            dst, src = args[0], args[1]
            if is_device(src) != is_device(dst):
                kind = SyncKind.ASYNC if (non_blocking or (len(args) > 2 and args[2])) else (
                    SyncKind.READBACK if is_device(src) else SyncKind.UPLOAD)
                self._count(kind, func, _nbytes(src))
            return out  # dst keeps what it was: host staging stays host
        elif func in _INPLACE and on_device and args:
            _tag(args[0])
        if on_device or kwargs.get("device") is not None:
            for t in tree_leaves(out):
                _tag(t)
        return out


def _names_host(args: tuple, kwargs: dict) -> bool:
    """Whether a ``.to(...)`` call moves to the host: this project writes that ``.to("cpu")``, the string, and a move
    to the device ``.to(device)`` with a ``torch.device`` (on the CPU both are the CPU: only the spelling tells)."""
    return kwargs.get("device") == "cpu" or any(isinstance(a, str) and a == "cpu" for a in args)


def _names_device(args: tuple, kwargs: dict) -> bool:
    """Whether a ``.to(...)`` call names a device (not only a dtype)."""
    if kwargs.get("device") is not None:
        return True
    return any(isinstance(a, torch.device | str) or (isinstance(a, torch.Tensor)) for a in args)


# --- around a driver worker's step (``LLM.collective_rpc(install)`` then ``collective_rpc(report)``) --------------
STEP_HOOKS = ("begin_step", "propose", "take")  # the adapter's parts of a step (both model runners)


def install(worker: Any) -> None:
    """Counts the host syncs of ``worker``'s adapter (``RemoteDraftWorker.adapter``) step by step: each call of its
    ``STEP_HOOKS`` runs under a ``HostSyncs`` with the tensors vLLM hands it marked as device tensors (all but the
    host-side ``*_cpu`` / ``*_np`` fields), as are the adapter's own device buffers. A rank without an adapter
    counts nothing, nor does a rank other than the driver (it drafts nothing)."""
    adapter = worker.adapter
    if adapter is None or adapter.speculation is None:
        return
    mode = HostSyncs()
    worker.host_sync_steps = steps = []  # one dict per propose call, with the syncs since the last one
    pending: list[Sync] = []
    HostSyncs.mark(*(v for k, v in vars(adapter).items() if isinstance(v, torch.Tensor) and not k.endswith("_cpu")))
    if getattr(adapter, "req_states", None) is not None:
        HostSyncs.mark(*(v for v in vars(adapter.req_states).values() if isinstance(v, torch.Tensor)))

    def wrap(name: str) -> None:
        method = getattr(adapter, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            HostSyncs.mark(*_device_inputs(args), *_device_inputs(kwargs.values()))
            with mode:
                out = method(*args, **kwargs)
            pending.extend(mode.take())
            if name == "propose":
                steps.append({"syncs": [(e.kind.value, e.op, e.site, e.nbytes) for e in pending],
                              "num_tokens": _num_tokens(args, kwargs)})
                pending.clear()
            return out

        setattr(adapter, name, counted)

    for name in STEP_HOOKS:
        wrap(name)


def report(worker: Any) -> list[dict[str, Any]]:
    """The steps ``install`` counted on this rank (empty where it counted none)."""
    return list(getattr(worker, "host_sync_steps", []))


def _device_inputs(values: Any) -> list[torch.Tensor]:
    """The device tensors among a hook's arguments: tensors, and tensor fields of the objects passed (vLLM's
    attention metadata, V2's input batch), but not their host-side copies (``*_cpu``, ``*_np``)."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, list | tuple):
            out.extend(_device_inputs(v))
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            out.extend(t for k, t in vars(v).items() if isinstance(t, torch.Tensor) and not k.endswith(("_cpu",
                                                                                                          "_np")))
    return out


def _num_tokens(args: tuple, kwargs: dict) -> int:
    """The step's scheduled tokens: the first dimension of the hidden states handed to ``propose``."""
    for key in ("target_hidden_states", "last_hidden_states"):
        if isinstance(kwargs.get(key), torch.Tensor):
            return int(kwargs[key].shape[0])
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 2]
    return int(tensors[0].shape[0]) if tensors else 0
