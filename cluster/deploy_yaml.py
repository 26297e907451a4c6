"""The deploy YAMLs as data: load one, change sections of its two applications' ``args``, write it. Tests,
benchmarks and the demo run variants of ``deploy/cpu.yaml`` through this, so the YAML's layout is known here
only (``cluster.config`` has the schema of each application's ``args``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from cluster.config import APP_NAME, DRAFTER_APP_NAME, PROJECT_ROOT, resolve_model_path

CPU_YAML = PROJECT_ROOT / "deploy" / "cpu.yaml"


def load(path: Path = CPU_YAML) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def app_args(doc: dict[str, Any], name: str = APP_NAME) -> dict[str, Any]:
    """One application's ``args`` (the dict inside ``doc``: changes to it change ``doc``)."""
    return next(a for a in doc["applications"] if a["name"] == name)["args"]


def with_changes(doc: dict[str, Any], drafter: dict[str, Any] | None = None, absolute: bool = False,
                 **sections: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``doc``: ``drafter`` merged into the drafter application's ``args``, each other keyword merged
    into that section of the verifier application's (``verifier={"max_num_seqs": 8}``); a changed target or head
    is changed in both applications. ``absolute``: model paths made absolute (a YAML written elsewhere)."""
    doc = copy.deepcopy(doc)
    main, pool = app_args(doc, APP_NAME), app_args(doc, DRAFTER_APP_NAME)
    for section, values in sections.items():
        main.setdefault(section, {}).update(values)
    pool["target"], pool["head"] = main["verifier"]["model"], main["speculative_config"]["model"]
    pool.update(drafter or {})
    if absolute:
        for args, keys in ((main["verifier"], ("model",)), (main["speculative_config"], ("model",)),
                           (pool, ("target", "head"))):
            for key in keys:
                args[key] = resolve_model_path(args[key])
    return doc


def write(doc: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def document(main: dict[str, Any], pool: dict[str, Any], host: str = "127.0.0.1", port: int = 8000
             ) -> dict[str, Any]:
    """A two-application deploy YAML (as ``deploy/cpu.yaml`` lays it out) for the verifier application's ``args``
    (``main``) and the drafter application's (``pool``)."""
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": host, "port": port},
        "applications": [
            {"name": APP_NAME, "route_prefix": "/", "import_path": "cluster.app:build_app", "args": main},
            {"name": DRAFTER_APP_NAME, "route_prefix": None, "import_path": "cluster.app:build_drafter_app",
             "args": pool},
        ],
    }


def dump(doc: dict[str, Any], header: str = "") -> str:
    """``doc`` as YAML text, after a comment line if ``header`` is given."""
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return comment + yaml.safe_dump(doc, sort_keys=False)
