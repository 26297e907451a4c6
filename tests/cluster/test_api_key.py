"""The one API key check behind HTTP and gRPC (``cluster.api_key``): what it accepts, and that it compares
digests in constant time."""

from __future__ import annotations

import pytest

from cluster import api_key as mod
from cluster.api_key import ApiKey


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer s3cret", True),
        ("bearer s3cret", True),  # the scheme is case-insensitive (RFC 7235), the key is not
        ("Bearer S3CRET", False),
        ("Bearer s3cret ", False),
        ("Bearer s3cre", False),
        ("Basic s3cret", False),
        ("s3cret", False),
        ("", False),
        (None, False),
    ],
)
def test_accepts_only_the_bearer_key(header, ok):
    assert ApiKey("s3cret").accepts(header) is ok


def test_no_key_accepts_all():
    assert not ApiKey(None).required and ApiKey(None).accepts(None) and ApiKey(None).accepts("Bearer x")


def test_compares_equal_length_digests_in_constant_time(monkeypatch):
    seen = []

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return a == b

    monkeypatch.setattr(mod.secrets, "compare_digest", spy)
    key = ApiKey("a-rather-long-key")
    assert not key.accepts("Bearer x") and key.accepts("Bearer a-rather-long-key")
    assert [(len(a), len(b)) for a, b in seen] == [(32, 32), (32, 32)]
    assert all(b"a-rather-long-key" not in (v if isinstance(v, bytes) else b"") and v != "a-rather-long-key"
               for v in vars(key).values())  # only the digest is kept
