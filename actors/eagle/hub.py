"""Model names as vLLM takes them: a local folder, or a Hugging Face hub id resolved to its snapshot folder.

Where it sits: ``DrafterActor`` resolves the head and the target it is given before reading anything, so a YAML
can name ``meta-llama/...`` ids as vLLM's ``--model`` and ``--speculative-config`` do. Like vLLM, a name that
is not an existing path is a repo id: ``huggingface_hub.snapshot_download`` returns its folder in the hub cache
(``HF_HOME`` / ``HF_HUB_CACHE``), downloading what is missing, or, with ``HF_HUB_OFFLINE=1``, only reading the
cache (a ``HeadConfigError`` names the repo when it is not there).

Only what the drafter reads is fetched: for a head, its configs and weights; for the target, its configs and
the safetensors shards that hold ``embed_tokens`` / ``lm_head`` (its index says which), not the whole model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from actors.eagle.spec import HeadConfigError

HEAD_FILES = ["*.json", "*.safetensors"]
CONFIG_FILES = ["*.json"]
SAFETENSORS_INDEX = "model.safetensors.index.json"


def _offline() -> bool:
    import huggingface_hub.constants

    return bool(huggingface_hub.constants.HF_HUB_OFFLINE)


def resolve_model_dir(name: str | Path, allow_patterns: list[str] | None = None) -> Path:
    """``name`` as is when it exists; else the hub snapshot folder of repo id ``name`` with ``allow_patterns``."""
    path = Path(name).expanduser()
    if path.exists():
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        folder = snapshot_download(repo_id=str(name), allow_patterns=allow_patterns, local_files_only=_offline())
    except HFValidationError as e:
        raise HeadConfigError(f"model {name!r}: neither a local folder nor a hub repo id ({e})") from None
    except (LocalEntryNotFoundError, RepositoryNotFoundError) as e:
        where = "in the local hub cache (HF_HUB_OFFLINE=1)" if _offline() else "on the hub"
        raise HeadConfigError(f"model {name!r}: not a local folder, and not found {where}: {e}") from None
    return Path(folder)


def resolve_target_dir(name: str | Path, tensor_names: Iterable[str]) -> Path:
    """The target's folder with its configs and the shards holding ``tensor_names`` (all of a local folder)."""
    if Path(name).expanduser().exists():
        return Path(name).expanduser()
    folder = resolve_model_dir(name, CONFIG_FILES)
    index = folder / SAFETENSORS_INDEX
    if not index.is_file():  # one unsharded file
        return resolve_model_dir(name, CONFIG_FILES + ["model.safetensors"])
    weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    shards = sorted({weight_map[t] for t in tensor_names if t in weight_map})
    return resolve_model_dir(name, CONFIG_FILES + shards)
