"""Images in chat requests at the verifier replica (``cluster.images``): good data URLs pass to the engine;
malformed ones, unsupported types, remote URLs (unless allowed) and too many images are a 400 naming the part, and
the replica keeps serving. Through the HTTP app Serve would build, in front of the fake engine of
``tests.cluster.fake_verifier``."""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import pytest
from PIL import Image

from cluster.config import EagleClusterConfig
from cluster.images import ImageError, check_chat_images, data_url
from tests.cluster.fake_verifier import CFG, FakeEngine, http_client, make_server


def _png(w=8, h=6) -> Image.Image:
    return Image.fromarray(np.full((h, w, 3), 120, np.uint8))


def _chat(*urls, text="describe"):
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 2}


def _gif_bytes() -> bytes:
    buf = io.BytesIO()
    _png().save(buf, format="GIF")
    return buf.getvalue()


SVG = "data:image/svg+xml;base64," + base64.b64encode(b"<svg xmlns='http://www.w3.org/2000/svg'/>").decode()
BAD = [
    ("data:image/png;base64,@@@not-base64@@@", "not valid base64"),
    ("data:image/png,rawbytes", "only base64"),
    ("data:image/png;base64,", "no image data"),
    ("data:;base64,AAAA", "unsupported image type ''"),
    ("data:image/png;base64," + base64.b64encode(b"definitely not a png").decode(), "not a readable PNG"),
    ("data:image/jpeg;base64," + base64.b64encode(_gif_bytes()).decode(), "is a GIF image, not JPEG"),
    (SVG, "unsupported image type 'image/svg+xml'"),
    ("data-image/png;base64,AAAA", "scheme"),
    ("https://example.com/cat.png", "remote image URLs are not fetched"),
    ("file:///etc/passwd", "scheme 'file'"),
]


@pytest.mark.parametrize(("url", "reason"), BAD)
def test_bad_image_is_a_400_naming_the_part_and_serving_goes_on(url, reason):
    http, verifier = http_client(max_images_per_request=2)
    r = http.post("/v1/chat/completions", json=_chat(data_url(_png()), url))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert reason in err["message"] and err["param"] == "messages.0.content.1.image_url"
    assert verifier.calls == 0
    ok = http.post("/v1/chat/completions", json=_chat(data_url(_png())))
    assert ok.status_code == 200 and verifier.calls == 1


def test_too_many_images_and_the_limit_from_the_engine():
    http, verifier = http_client(max_images_per_request=2)
    r = http.post("/v1/chat/completions", json=_chat(*[data_url(_png())] * 3))
    assert r.status_code == 400
    assert "3 images in this request; the model takes at most 2" in r.json()["error"]["message"]
    assert http.post("/v1/chat/completions", json=_chat(*[data_url(_png())] * 2)).status_code == 200
    assert verifier.calls == 1
    cfg = EagleClusterConfig.model_validate({**CFG, "verifier": {
        **CFG["verifier"], "engine_kwargs": {"limit_mm_per_prompt": {"image": 3}}}})
    assert cfg.ingress_for_verifier().max_images_per_request == 3
    assert EagleClusterConfig.model_validate(CFG).ingress_for_verifier().max_images_per_request is None


def test_good_images_of_each_type_pass():
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP"):
        assert check_chat_images(_chat(data_url(_png(), fmt))["messages"], 1, False) == 1
    buf = io.BytesIO()
    _png().save(buf, format="JPEG")
    assert data_url(buf.getvalue()).startswith("data:image/jpeg;base64,")
    assert check_chat_images([{"role": "user", "content": "text only"}], 0, False) == 0
    assert check_chat_images(_chat("https://example.com/a.png")["messages"], 1, allow_remote=True) == 1
    with pytest.raises(ImageError, match="image_url part"):
        check_chat_images([{"role": "user", "content": [{"type": "image_embeds", "image_embeds": "x"}]}], 1, False)


def test_handle_chat_checks_images_too():
    from cluster.errors import BadRequest

    ingress = make_server(FakeEngine(), max_images_per_request=1)
    out = asyncio.run(ingress.chat(_chat(data_url(_png()))["messages"], max_tokens=2))
    assert out["choices"][0]["text"] == "ok"
    with pytest.raises(BadRequest, match="not valid base64"):
        asyncio.run(ingress.chat(_chat("data:image/png;base64,!!")["messages"], max_tokens=2))
