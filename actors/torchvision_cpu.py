"""Makes PyPI's ``torchvision`` importable next to a CPU-only ``torch`` (what vLLM's Llama 4 image path needs).

Why: vLLM's ``mllama4.py`` imports ``transformers.models.llama4.image_processing_llama4``, which imports
``torchvision.transforms.v2`` at its top (transformers 5.19 has no PIL-only Llama 4 image processor). PyPI has
only CUDA builds of torchvision for Linux x86-64 (``torchvision==0.28.0`` is the one for ``torch==2.13``), and no
source distribution; with ``torch==2.13.0+cpu`` its compiled ``_C`` cannot load (it links ``libc10_cuda.so``).
torchvision then fails at import: ``_meta_registrations.py`` registers fake kernels for ``torchvision::nms`` and
``torchvision::qnms`` without checking that ``_C`` defined them ("operator torchvision::nms does not exist"), and
that import error is what broke transformers' Llama 4 import. Everything the Llama 4 image processor uses
(``transforms.v2.functional`` resize / rescale / normalize on tensors) is plain PyTorch.

``install()`` puts a finder in front of ``import torchvision``: it tries to load torchvision's ``_C`` itself and,
only when that fails, defines the two operators' schemas (no kernels: calling ``nms`` still fails, loudly), so the
rest of torchvision imports. Where ``_C`` loads (a CUDA torch), nothing is defined and torchvision is untouched.
The Makefile installs ``torchvision==0.28.0 --no-deps`` and a ``.pth`` line calling ``install()`` at start-up, so
every process of the venv (vLLM's engine core, Ray workers) has it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_state: dict[str, object] = {}  # "lib": the Library holding the schemas (kept alive), "compiled": whether _C loaded


def _prepare(search_locations: list[str]) -> None:
    import torch

    for loc in search_locations:
        for lib in sorted(Path(loc).glob("_C*.so")):
            try:
                torch.ops.load_library(str(lib))
                _state["compiled"] = True
                return
            except (OSError, RuntimeError):
                pass
    _state["compiled"] = False
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name, schema in _SCHEMAS.items():
        if not hasattr(torch.ops.torchvision, name):
            lib.define(schema)
    _state["lib"] = lib


class _TorchvisionFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)  # once; the real finders do the import
        spec = importlib.util.find_spec("torchvision")
        if spec is not None and spec.submodule_search_locations:
            _prepare(list(spec.submodule_search_locations))
        return spec


def install() -> None:
    """Idempotent; cheap (no torch import until something imports torchvision)."""
    if "torchvision" in sys.modules or any(isinstance(f, _TorchvisionFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TorchvisionFinder())


def compiled_ops() -> bool | None:
    """Whether torchvision's compiled ops loaded (None: torchvision not imported through ``install``)."""
    return _state.get("compiled")  # type: ignore[return-value]
