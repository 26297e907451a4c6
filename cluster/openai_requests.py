"""Client bytes -> vLLM's own OpenAI protocol models, or ``BadRequest`` (400) naming the field and the reason; a
generation request's sampling parameters are checked as vLLM's ``SamplingParams`` checks them (``check_sampling``).

Every surface of the verifier replica (``cluster.verifier_server``: HTTP, gRPC, the Python handle) builds its
request here, so a bad request is answered before it reaches the engine, and the same way on each. Client bytes
are only ever parsed as JSON (or protobuf, by gRPC), never unpickled.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from cluster.errors import BadRequest

DEFAULT_MAX_TOKENS = 16  # a gRPC request's max_tokens 0 (the proto's default): OpenAI's and vLLM's default
# Fields vLLM accepts but that this deployment does not serve (they would be silently ignored or need features not
# enabled here): refused with 400 rather than dropped. min_p and logit_bias do not work with vLLM's speculative
# decoding (vLLM says so at start-up).
UNSUPPORTED = {"suffix", "kv_transfer_params", "vllm_xargs", "cache_salt", "min_p", "logit_bias"}


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"malformed JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the request body must be a JSON object")
    return body


def _validated(validate: Any, body: dict[str, Any]) -> Any:
    try:
        return validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise BadRequest(400, f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")), loc or None) from None
    except Exception as e:  # vLLM's own validators raise VLLMValidationError, which pydantic does not wrap
        raise BadRequest(400, str(e), getattr(e, "parameter", None)) from None


def parse_request(raw: bytes, model_cls: type, max_n: int | None = None) -> Any:
    """JSON bytes -> a vLLM generation request (``CompletionRequest``, ``ChatCompletionRequest``), or
    ``BadRequest`` naming the field and the reason (unknown and unsupported fields, ``n`` over ``max_n``)."""
    body = _json_object(raw)
    known = set(model_cls.model_fields)
    for key in body:
        if key not in known:
            raise BadRequest(400, f"unknown field {key!r}", key)
        if key in UNSUPPORTED and body[key] not in (None, False, 0, 0.0, {}):
            raise BadRequest(400, f"field {key!r} is not supported by this deployment", key)
    n = body.get("n")
    if max_n is not None and isinstance(n, int) and not isinstance(n, bool) and n > max_n:
        raise BadRequest(400, f"n: at most {max_n} completions per request here, got {n}", "n")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise BadRequest(400, f"max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens")
    req = _validated(model_cls.model_validate, body)
    check_sampling(req, max_tokens)
    return req


def check_sampling(req: Any, max_tokens: int | None) -> None:
    """The request's sampling parameters as vLLM's ``SamplingParams`` checks them (temperature finite and in [0, 2],
    top_p in (0, 1], penalties, top_k, min_tokens, ...), or ``BadRequest`` (400) with vLLM's reason, which names the
    field. The protocol models take any float (NaN and negative temperatures, top_p 5) and vLLM checks these only
    when its serving code builds the engine's parameters; here every surface refuses them first, the same way.
    The server's default parameters are left out: only what the client set can be wrong."""
    from vllm.exceptions import VLLMClientError

    if not hasattr(req, "to_sampling_params"):
        return
    try:
        req.to_sampling_params(max_tokens or 2**31 - 1, {})
    except (VLLMClientError, ValueError) as e:
        message = str(e.args[0]) if e.args else str(e)
        raise BadRequest(400, message, getattr(e, "parameter", None)) from None


def parse_tokenize(raw: bytes, detokenize: bool = False) -> Any:
    """JSON bytes -> vLLM's ``TokenizeRequest`` (a completion or a chat body) or ``DetokenizeRequest``, validated
    as vLLM's own ``/tokenize`` and ``/detokenize`` routes validate them."""
    from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest, TokenizeRequest

    adapter = TypeAdapter(DetokenizeRequest if detokenize else TokenizeRequest)
    return _validated(adapter.validate_python, _json_object(raw))


def completion_request(prompt: str, sampling: dict[str, Any], stream: bool) -> Any:
    """A handle or gRPC call's arguments, validated exactly as an HTTP body would be."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return parse_request(json.dumps({"prompt": prompt, **sampling, "stream": stream}).encode(), CompletionRequest)


def check_images(req: Any, max_images: int | None, allow_remote: bool) -> None:
    """Image parts of a chat request (``cluster.images``), or ``BadRequest`` (400) naming the bad one."""
    from cluster.images import ImageError, check_chat_images

    try:
        check_chat_images(getattr(req, "messages", None), max_images, allow_remote)
    except ImageError as e:
        raise BadRequest(400, f"{e.param}: {e.message}", e.param) from None
