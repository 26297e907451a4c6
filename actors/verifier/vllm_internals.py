"""What the verifier's vLLM adapters rely on in vLLM, checked at start: a vLLM that moved one fails loudly, naming it,
instead of silently in a step. Each adapter lists its own (``vllm_adapter.VLLM_INTERNALS`` for model runner V1,
``vllm_v2_adapter.VLLM_V2_INTERNALS`` for V2) as ``("module:Class", "attribute")`` pairs, or ``("module", "name")``
for a module-level name; the worker checks the list of the runner vLLM built."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Iterable


def missing(internals: Iterable[tuple[str, str]]) -> list[str]:
    """The entries of ``internals`` this vLLM lacks, as ``"module:Class.attribute"``. An attribute counts as present
    on a class, as a dataclass field, or as an instance attribute its ``__init__`` assigns (``self.name =``)."""
    out = []
    for path, attr in internals:
        module, _, name = path.partition(":")
        try:
            owner = importlib.import_module(module)
            owner = getattr(owner, name) if name else owner
        except (ImportError, AttributeError):
            out.append(f"{path}.{attr}")
            continue
        if not hasattr(owner, attr) and attr not in _instance_attributes(owner):
            out.append(f"{path}.{attr}")
    return out


def check(internals: Iterable[tuple[str, str]], adapter: str) -> None:
    """``RuntimeError`` naming each of ``internals`` this vLLM lacks (``adapter``: which hook relies on them)."""
    if lacked := missing(internals):
        raise RuntimeError(f"eagle_cluster verifier: this vLLM lacks {', '.join(lacked)}; the remote drafter hooks "
                           f"vLLM 0.32's {adapter}")


def _instance_attributes(owner: object) -> set[str]:
    if not inspect.isclass(owner):
        return set()
    if dataclasses.is_dataclass(owner):
        return {f.name for f in dataclasses.fields(owner)}
    try:
        return set(re.findall(r"self\.(\w+)\s*[:=]", inspect.getsource(owner.__init__)))
    except (OSError, TypeError):
        return set()
