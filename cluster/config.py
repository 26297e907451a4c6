"""The configs a ``serve deploy`` YAML's two applications validate their ``args:`` into.

The verifier application (``cluster.app:build_app``, ``EagleClusterConfig``):

    args:
      verifier:    {model, served_model_name, tensor_parallel_size, max_model_len, engine_kwargs, num_replicas, ...}
      speculative_config: {method: eagle|eagle3, model, num_speculative_tokens, ...}   # vLLM's keys, as in the seeds
      ingress:     {api_key, grpc: {enabled, allow_unauthenticated}, metrics_require_api_key, max_body_bytes, max_n,
                    max_inflight_requests, retry_after_s, max_images_per_request, allow_remote_images}
      drafter_app: eagle-drafters          # the drafter application's name

The drafter application (``cluster.app:build_drafter_app``, ``DrafterPoolConfig``), a Serve application of its
own so that it is configured, redeployed and scaled without touching the verifier (Serve versions every
deployment of an application by a hash of the application's whole ``args``: one application would restart the
verifier's engine for any drafter change):

    args:
      target: ..., head: ..., max_model_len: ...     # the verifier's model, speculative_config.model, and length
      num_cpus, num_gpus, resources, num_replicas | autoscaling_config, dtype, max_num_seqs, kv_cache_gib,
      idle_slot_ttl_s, timeout_s, async_drafting, ...

      DrafterPoolConfig.for_drafter() turns it into the drafter's frozen settings (actors.drafter.config.
      DrafterSettings), which cluster.app binds to each drafter replica and the replica hands whole to its actor.

Model paths: a relative path resolves against the current directory (a Serve ``runtime_env`` ``working_dir``
when the YAML sets one), else against the project's folder (where ``models/`` ships), so a YAML means the same
wherever ``ray start`` ran; a name found in neither is a Hugging Face id.

Errors name the field and the reason. Checks that need the checkpoints (tensor parallelism that does not divide
the heads, a head made for another target) run when the model paths are local folders; hub ids are checked by
vLLM when the engine starts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator, model_validator

from actors.drafter.branches import BranchConfig
from actors.drafter.config import DEFAULT_MAX_MODEL_LEN, DrafterEngineConfig, DrafterSettings
from actors.eagle.compat import check_head_fits_target, target_text_config
from actors.eagle.spec import HeadConfigError, HeadSpec, load_head_spec
from actors.engine_spin import DEFAULT_SPIN_S, MIN_SPIN_S
from actors.messages import MAX_SPECULATIVE_TOKENS
from actors.verifier.drafters import DRAFT_TIMEOUT_S
from actors.verifier.options import expected_runner, refuse_unsupported
from cluster.drafter_pool.autoscaling import DrafterLoadPolicy

logger = logging.getLogger(__name__)
PROJECT_ROOT = Path(__file__).resolve().parent.parent  # the folder holding cluster/ and models/
APP_NAME = "eagle-cluster"  # the verifier application, as deploy/*.yaml names it
DRAFTER_APP_NAME = "eagle-drafters"  # the drafter application
DRAFTER_DEPLOYMENT = "Drafter"  # the drafter application's one deployment

# Keys the seed PRs pass that this vLLM no longer has; accepted (so their JSON pastes as is) and dropped.
LEGACY_SPECULATIVE_KEYS = {"prefill_token_shift"}


def _vllm_speculative_keys() -> set[str]:
    try:
        from vllm.config import SpeculativeConfig

        return {f.name for f in dataclasses.fields(SpeculativeConfig)}
    except ImportError:  # pragma: no cover - vLLM is a dependency; keep the config importable without it
        return {"method", "model", "num_speculative_tokens", "draft_tensor_parallel_size", "max_model_len"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def resolve_model_path(path: str) -> str:
    """An absolute path for a model folder named relatively (see the module docstring); a hub id as it is."""
    p = Path(path).expanduser()
    for candidate in (p,) if p.is_absolute() else (p, PROJECT_ROOT / p):
        if candidate.exists():
            return os.path.abspath(candidate)
    return path


class VerifierConfig(_Strict):
    model: str = Field(description="target checkpoint: a local folder or a Hugging Face id")
    served_model_name: str | None = None
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int = Field(1024, ge=16)
    max_num_seqs: int = Field(32, ge=1)
    num_replicas: int = Field(1, ge=1)
    accelerator: Literal["cpu", "gpu"] = "cpu"
    num_cpus: float = Field(1.0, ge=0, description="CPUs per TP bundle")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources, per TP bundle")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed through to vLLM")
    hidden_transport: Literal["auto", "host", "shm"] = Field(
        "auto", description="how each step's hidden rows reach a drafter (actors.verifier.transport): shared memory "
        "with a drafter on the verifier's node (auto), always the host path (host), or shared memory forced (shm)")
    engine_spin_s: float | None = Field(
        DEFAULT_SPIN_S, ge=MIN_SPIN_S, description="how long vLLM's engine core and workers spin on their "
        "shared-memory queues before they sleep (actors.engine_spin); None: vLLM's default (1 s)")

    @field_validator("model")
    @classmethod
    def _resolve(cls, v: str) -> str:
        return resolve_model_path(v)

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.model).name

    @property
    def executor_backend(self) -> str | None:
        """vLLM's ``distributed_executor_backend``: as ``engine_kwargs`` sets it, else ``"ray"`` on GPUs with
        tensor parallelism (vLLM's Ray executor puts one worker in each GPU bundle of the replica's placement
        group), else vLLM's choice (``"uni"`` at TP 1: the model runs in the engine-core process)."""
        backend = self.engine_kwargs.get("distributed_executor_backend")
        if backend is None and self.accelerator == "gpu" and self.tensor_parallel_size > 1:
            return "ray"
        return backend

    def vllm_engine_kwargs(self) -> dict[str, Any]:
        """What the engine gets beyond ``actors.vllm_engine.engine_kwargs``' CPU settings: on GPUs, the model's own
        dtype and CUDA graphs / torch.compile (the CPU settings are float32 and eager); then ``engine_kwargs`` as
        given, and the executor backend."""
        engine: dict[str, Any] = {"dtype": "auto", "enforce_eager": False} if self.accelerator == "gpu" else {}
        engine.update(self.engine_kwargs)
        if self.executor_backend is not None:  # on GPUs with TP > 1: "ray", the TP workers in the replica's bundles
            engine["distributed_executor_backend"] = self.executor_backend
        return engine

    @property
    def replica_gpus(self) -> int:
        """GPUs the Serve replica itself holds: on GPUs, the one of bundle 0 when the engine runs the model in the
        replica's own process tree (any backend but ``"ray"``), so that Ray sets the replica's
        ``CUDA_VISIBLE_DEVICES`` to that GPU and vLLM's engine-core process inherits it; without it Ray leaves the
        variable unset and the engine takes the node's GPU 0, whichever GPU the bundle holds. With ``"ray"`` the
        replica holds none: each TP worker takes its bundle's GPU (a replica holding bundle 0's would leave
        worker 0 waiting for it)."""
        return 1 if self.accelerator == "gpu" and self.executor_backend != "ray" else 0

    @model_validator(mode="after")
    def _engine_kwargs(self) -> VerifierConfig:
        try:
            # async scheduling (on model runner V1), pipeline parallelism
            refuse_unsupported(self.engine_kwargs, expected_runner(self.accelerator))
        except ValueError as e:
            raise ValueError(f"verifier.engine_kwargs.{e}") from None
        if self.accelerator == "gpu" and self.tensor_parallel_size > 1 and self.executor_backend != "ray":
            raise ValueError(
                f"verifier.engine_kwargs.distributed_executor_backend: {self.executor_backend!r} with "
                f"tensor_parallel_size {self.tensor_parallel_size} on GPUs: its workers would take the node's first "
                "GPUs, not the replica's placement group bundles; leave it out (\"ray\")")
        return self


class SpeculativeConfig(BaseModel):
    """vLLM's ``speculative_config`` (EAGLE / EAGLE-3 only): paste the JSON of a ``vllm serve`` command."""

    model_config = ConfigDict(extra="allow")
    method: Literal["eagle", "eagle3"]
    model: str
    num_speculative_tokens: int = Field(ge=1, le=MAX_SPECULATIVE_TOKENS)
    draft_tensor_parallel_size: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=16)
    # vLLM's schedule ([start, end, k] inclusive batch-size ranges), or "auto" (this project's: k per step from
    # what the verifier measures; ``actors.verifier.draft_length``). Absent: k = num_speculative_tokens always.
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | Literal["auto"] | None = None

    @field_validator("model")
    @classmethod
    def _resolve(cls, v: str) -> str:
        return resolve_model_path(v)

    @field_validator("num_speculative_tokens_per_batch_size", mode="before")
    @classmethod
    def _schedule(cls, v: Any) -> Any:
        """As vLLM validates it (its own function), or ``"auto"``."""
        if v is None or v == "auto":
            return v
        if isinstance(v, str):
            raise ValueError(f"{v!r}: a list of [start, end, k] batch-size ranges, or 'auto'")
        from actors.verifier.draft_length import validate_schedule

        return [list(e) for e in validate_schedule(v)]

    @model_validator(mode="after")
    def _known_keys(self) -> SpeculativeConfig:
        known = _vllm_speculative_keys()
        for key in list(self.model_extra or {}):
            if key in LEGACY_SPECULATIVE_KEYS:
                logger.warning("speculative_config.%s is not a key of this vLLM; ignored", key)
                self.model_extra.pop(key)
            elif key not in known:
                raise ValueError(f"unknown key {key!r} (not a vLLM speculative_config key)")
        return self

    def for_vllm(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class AutoscalingConfig(_Strict):
    """The drafter pool's size, on drafter load (``cluster.drafter_pool.autoscaling.DrafterLoadPolicy``)."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    initial_replicas: int | None = Field(None, ge=0)
    target_sequences_per_replica: float = Field(16, gt=0, description="active sequences a replica should hold")
    target_draft_ms: float | None = Field(None, gt=0, description="also grow while steps draft slower than this")
    upscale_delay_s: float = Field(5.0, ge=0)
    downscale_delay_s: float = Field(30.0, ge=0)
    look_back_period_s: float = Field(10.0, gt=0, description="window the replicas' load reports are averaged over")
    metrics_interval_s: float = Field(1.0, gt=0, description="how often each replica reports its load")

    def for_serve(self) -> dict[str, Any]:
        """Ray Serve's ``autoscaling_config`` with this policy."""
        return {
            **self.model_dump(
                include={"min_replicas", "max_replicas", "initial_replicas", "upscale_delay_s", "downscale_delay_s",
                         "look_back_period_s", "metrics_interval_s"},
                exclude_none=True,
            ),
            "policy": {
                "policy_function": DrafterLoadPolicy,
                "policy_kwargs": {"target_sequences_per_replica": self.target_sequences_per_replica,
                                  "target_draft_ms": self.target_draft_ms},
            },
        }

    @model_validator(mode="after")
    def _order(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        if self.look_back_period_s <= self.metrics_interval_s:
            raise ValueError(f"look_back_period_s {self.look_back_period_s} must be > metrics_interval_s "
                             f"{self.metrics_interval_s}")
        return self


class AsyncDraftingConfig(_Strict):
    """Asynchronous drafting (``actors.drafter.branches``): while the verifier verifies, each drafter drafts the
    next step for the likely outcomes; a step whose outcome was guessed is answered at once."""

    enabled: bool = False
    bonus_fanout: int = Field(2, ge=1, le=8, description="guesses for the bonus token (all drafts accepted)")
    recovered_fanout: int = Field(1, ge=0, le=4, description="guesses for the recovered token per rejection point")
    max_branch_rows: int | None = Field(
        32, ge=0, description="branches per step for a replica's whole batch: fewer per sequence as the batch "
        "grows, none past it (drafted on demand); null: no limit")

    def for_drafter(self) -> BranchConfig | None:
        """The engine's ``branches`` (``DrafterEngineConfig.branches``): None when off."""
        return BranchConfig(**self.model_dump(exclude={"enabled"})) if self.enabled else None


def _head_fits(target: str, head: str, field: str) -> HeadSpec | None:
    """The head's spec once checked against the target (local folders only; hub ids are checked at start)."""
    if not (Path(target) / "config.json").is_file() or not (Path(head) / "config.json").is_file():
        return None
    try:
        spec = load_head_spec(Path(head))
        check_head_fits_target(spec, target_text_config(Path(target)))
    except HeadConfigError as e:
        raise ValueError(f"{field}: {e}") from None
    return spec


class DrafterConfig(_Strict):
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    resources: dict[str, float] = Field(default_factory=dict)
    num_replicas: int | None = Field(None, ge=1)
    autoscaling_config: AutoscalingConfig | None = None
    num_threads: int = Field(1, ge=1, description="torch threads per drafter replica")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: the head's torch_dtype on a GPU, float32 on a CPU (actors.drafter.placement)")
    max_num_seqs: int = Field(1024, ge=1, description="sequences one drafter replica holds draft state for; "
                              "more get no drafts")
    kv_cache_gib: float | None = Field(None, gt=0, description="the draft KV cache's memory cap per replica; "
                                       "null: 60% of the GPU memory free after the weights (no cap on a CPU)")
    idle_slot_ttl_s: float | None = Field(300.0, gt=0, description="a sequence not stepped for this long loses its "
                                          "draft KV slot (its verifier died, its free was lost); null: never")
    cpu_affinity: list[NonNegativeInt] | None = Field(
        None, min_length=1, description="bind each drafter's process to these cores (a drafter with cores of its own)")
    timeout_s: float = Field(DRAFT_TIMEOUT_S, gt=0, description="the longest a verifier step waits for a drafter "
                             "(it waits ten step periods, at least 1 s, when it knows the step period)")
    max_ongoing_requests: int = Field(32, ge=1, description="concurrent draft calls per replica (all verifiers)")
    async_drafting: AsyncDraftingConfig = Field(default_factory=AsyncDraftingConfig)
    max_speculative_tokens: int = Field(
        MAX_SPECULATIVE_TOKENS, ge=1, le=MAX_SPECULATIVE_TOKENS,
        description="the most draft tokens a verifier's step may ask for (its num_speculative_tokens); a step "
        "asking for more drafts nothing")
    enforce_eager: bool = Field(False, description="on a GPU, run decode steps eagerly instead of replaying CUDA "
                                "graphs (vLLM's name; actors/drafter/decode_step.py)")
    cuda_graph_max_batch: int = Field(128, ge=1, le=1024, description="on a GPU, the largest decode batch replayed "
                                      "from a CUDA graph; larger batches run eagerly")

    @model_validator(mode="after")
    def _one_scaling(self) -> DrafterConfig:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("set num_replicas or autoscaling_config, not both")
        return self


class GrpcConfig(_Strict):
    """The app's gRPC service (``deploy/eagle_cluster.proto``). Serve's gRPC proxy, which a YAML's top-level
    ``grpc_options`` starts, listens on all interfaces (``[::]:port``; Ray 2.60 has no host option for it), so
    serving gRPC needs ``ingress.api_key``, or ``allow_unauthenticated: true`` to say that an open port is meant."""

    enabled: bool = Field(False, description="answer gRPC calls; off: every call gets UNIMPLEMENTED")
    allow_unauthenticated: bool = Field(
        False, description="serve gRPC without ingress.api_key, to anyone who reaches the port (all interfaces)")


class IngressConfig(_Strict):
    api_key: str | None = Field(
        None, min_length=1, description="if set, HTTP needs 'Authorization: Bearer <key>', gRPC the same metadata")
    grpc: GrpcConfig = Field(default_factory=GrpcConfig)
    metrics_require_api_key: bool = Field(False, description="/metrics needs the key too (else it is open, as /health)")
    max_body_bytes: int = Field(2 << 20, ge=1024, description="larger HTTP request bodies get 413")
    max_n: int = Field(8, ge=1, description="a request asking for more completions (`n`) gets 400")
    max_inflight_requests: int = Field(
        256, ge=1, description="generation requests in flight per verifier replica (HTTP and gRPC); past it: HTTP 503 "
        "with Retry-After, gRPC UNAVAILABLE")
    retry_after_s: int = Field(1, ge=1, description="the Retry-After of those 503s")
    access_log: bool = Field(False, description="Serve's per-request access log lines for the verifier replicas")
    max_images_per_request: int | None = Field(
        None, ge=0, description="chat requests with more image parts get 400 (default: the verifier's "
        "engine_kwargs.limit_mm_per_prompt.image, when set)")
    allow_remote_images: bool = Field(
        False, description="image_url parts with http(s) URLs are fetched by the verifier; if false (default) they "
        "get 400 and only base64 data URLs are taken")

    @model_validator(mode="before")
    @classmethod
    def _no_replicas(cls, v: Any) -> Any:
        if isinstance(v, dict) and "num_replicas" in v:
            raise ValueError("ingress.num_replicas: the verifier replicas are the HTTP and gRPC ingress (there is no "
                             "separate ingress deployment): set verifier.num_replicas instead")
        return v

    @model_validator(mode="after")
    def _grpc_needs_key(self) -> IngressConfig:
        if self.grpc.enabled and self.api_key is None and not self.grpc.allow_unauthenticated:
            raise ValueError(
                "ingress.api_key: required when ingress.grpc.enabled is true: Serve's gRPC proxy listens on all "
                "interfaces ([::]:port), so set an API key, or ingress.grpc.allow_unauthenticated: true to serve "
                "gRPC to anyone who reaches the port")
        if self.metrics_require_api_key and self.api_key is None:
            raise ValueError("ingress.metrics_require_api_key: true needs ingress.api_key")
        return self


class DrafterPoolConfig(DrafterConfig):
    """The drafter application's ``args``: which head drafts for which target, and the pool's settings."""

    target: str = Field(description="the verifier's model (the drafter reads its embeddings / lm_head)")
    head: str = Field(description="the EAGLE / EAGLE-3 head: the verifier's speculative_config.model")
    max_model_len: int = Field(DEFAULT_MAX_MODEL_LEN, ge=16, description="the longest sequence drafted for: the "
                               "verifier's max_model_len or more (the last positions get no drafts past it)")

    def for_drafter(self) -> DrafterSettings:
        """The drafter's settings, built once here and bound whole to each replica, which hands them to its actor
        and engine (``actors.drafter.config``)."""
        engine = DrafterEngineConfig(
            max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs, kv_cache_gib=self.kv_cache_gib,
            idle_slot_ttl_s=self.idle_slot_ttl_s, max_k=self.max_speculative_tokens,
            branches=self.async_drafting.for_drafter(), enforce_eager=self.enforce_eager,
            cuda_graph_max_batch=self.cuda_graph_max_batch,
        )
        return DrafterSettings(
            self.head, self.target, engine, num_threads=self.num_threads,
            cpu_affinity=None if self.cpu_affinity is None else tuple(self.cpu_affinity),
            dtype=None if self.dtype == "auto" else self.dtype,
        )

    @field_validator("target", "head")
    @classmethod
    def _resolve(cls, v: str) -> str:
        return resolve_model_path(v)

    @model_validator(mode="after")
    def _fits(self) -> DrafterPoolConfig:
        _head_fits(self.target, self.head, "head")
        return self


class EagleClusterConfig(_Strict):
    verifier: VerifierConfig
    speculative_config: SpeculativeConfig
    ingress: IngressConfig = Field(default_factory=IngressConfig)
    drafter_app: str = Field(DRAFTER_APP_NAME, min_length=1, description="the drafter application's name")

    def ingress_for_verifier(self) -> IngressConfig:
        """The ingress section, with the image limit defaulting to the verifier engine's ``limit_mm_per_prompt``."""
        limit = self.verifier.engine_kwargs.get("limit_mm_per_prompt") or {}
        if self.ingress.max_images_per_request is None and isinstance(limit, dict) and isinstance(
                limit.get("image"), int):
            return self.ingress.model_copy(update={"max_images_per_request": limit["image"]})
        return self.ingress

    @field_validator("verifier", mode="before")
    @classmethod
    def _model_shortcut(cls, v: Any) -> Any:
        return {"model": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _fits(self) -> EagleClusterConfig:
        target = Path(self.verifier.model)
        head = Path(self.speculative_config.model)
        if (target / "config.json").is_file():
            tcfg = target_text_config(target)
            tp = self.verifier.tensor_parallel_size
            heads, kv = tcfg["num_attention_heads"], tcfg.get("num_key_value_heads", tcfg["num_attention_heads"])
            if heads % tp:
                raise ValueError(
                    f"verifier.tensor_parallel_size: {tp} does not divide the target's {heads} attention heads"
                )
            if kv % tp and tp % kv:
                raise ValueError(f"verifier.tensor_parallel_size: {tp} and the target's {kv} KV heads do not divide")
            spec = _head_fits(str(target), str(head), "speculative_config.model")
            if spec is not None and spec.method.value != self.speculative_config.method:
                raise ValueError(
                    f"speculative_config.method: {self.speculative_config.method!r}, but {head} is an "
                    f"{spec.method.value} head"
                )
        return self
