"""Images in chat requests, checked at the ingress before they reach the verifier.

OpenAI chat messages carry images as content parts ``{"type": "image_url", "image_url": {"url": ...}}``. The
verifier's vLLM serving code (``OpenAIServingChat``) decodes them and puts ``<|image|>`` in the prompt; what it
would do with a bad one (a data URL that is not base64, an SVG, a remote URL on a machine without network, more
images than the engine's ``limit_mm_per_prompt``) ranges from a 400 to a hang on the fetch timeout. So the
ingress answers each of those with a 400 naming the part and the problem:

- ``data:image/<png|jpeg|webp|gif|bmp>;base64,<payload>``: decoded (strict base64) and opened with PIL;
- ``http(s)://``: refused unless ``ingress.allow_remote_images`` (then the verifier fetches it, as vLLM does);
- any other scheme: refused;
- more than ``max_images`` image parts in a request: refused.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from typing import Any

IMAGE_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP",
               "image/gif": "GIF", "image/bmp": "BMP"}
_DATA_URL = re.compile(r"^data:(?P<mime>[^;,]*)(?P<params>(?:;[^;,]*)*),(?P<data>.*)$", re.DOTALL)


class ImageError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def data_url(image: Any, fmt: str = "PNG") -> str:
    """A PIL image, or encoded image bytes (PNG, JPEG, ...), as a base64 data URL for a chat message."""
    if isinstance(image, bytes | bytearray):
        from PIL import Image

        raw = bytes(image)
        fmt = Image.open(io.BytesIO(raw)).format or fmt
    else:
        buf = io.BytesIO()
        image.save(buf, format=fmt)
        raw = buf.getvalue()
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(raw).decode()}"


def check_data_url(url: str, param: str) -> None:
    from PIL import Image, UnidentifiedImageError

    m = _DATA_URL.match(url)
    if m is None:
        raise ImageError("malformed data URL: expected data:image/<type>;base64,<data>", param)
    mime = m["mime"].strip().lower()
    if mime not in IMAGE_TYPES:
        kinds = sorted(set(IMAGE_TYPES) - {"image/jpg"})
        raise ImageError(f"unsupported image type {mime[:60]!r}: send one of {kinds}", param)
    if ";base64" not in m["params"].lower():
        raise ImageError("malformed data URL: only base64 data URLs are accepted (data:<type>;base64,<data>)", param)
    try:
        raw = base64.b64decode(m["data"].strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("malformed data URL: the data is not valid base64", param) from None
    if not raw:
        raise ImageError("malformed data URL: no image data", param)
    try:
        with Image.open(io.BytesIO(raw)) as im:
            im.verify()
            found = im.format
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise ImageError(f"the data is not a readable {IMAGE_TYPES[mime]} image", param) from None
    if found != IMAGE_TYPES[mime]:
        raise ImageError(f"the data is a {found} image, not {IMAGE_TYPES[mime]} as its type {mime!r} says", param)


def check_chat_images(messages: Any, max_images: int | None, allow_remote: bool) -> int:
    """The number of image parts in ``messages``, or ``ImageError`` naming the first bad one."""
    count = 0
    for i, msg in enumerate(messages or []):
        content = msg.get("content") if isinstance(msg, dict) else getattr(msg, "content", None)
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            param = f"messages.{i}.content.{j}"
            if kind in ("image_pil", "image_embeds", "input_image"):
                raise ImageError(f"content part type {kind!r} is not accepted here: send an image_url part", param)
            if kind != "image_url":
                continue
            count += 1
            ref = part.get("image_url")
            url = ref.get("url") if isinstance(ref, dict) else ref
            param += ".image_url"
            if not isinstance(url, str) or not url:
                raise ImageError("image_url.url: a data URL or an http(s) URL is required", param)
            scheme = url.split(":", 1)[0].lower() if ":" in url else ""
            if scheme == "data":
                check_data_url(url, param)
            elif scheme in ("http", "https"):
                if not allow_remote:
                    raise ImageError("remote image URLs are not fetched by this deployment "
                                     "(ingress.allow_remote_images is false): send the image as a base64 data URL",
                                     param)
            else:
                raise ImageError(f"image URL scheme {scheme[:20]!r} is not accepted: use a base64 data URL", param)
    if max_images is not None and count > max_images:
        raise ImageError(f"{count} images in this request; the model takes at most {max_images} per request",
                         "messages")
    return count
