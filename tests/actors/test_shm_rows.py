"""The shared-memory region for hidden rows (``actors.shm_rows``), both ends in this process, no Ray: rows read back
bit for bit (float32 and bf16 bits, consecutive and scattered rows), one copy written straight into the slot, a slot
rewritten under a reader or named with another generation refused (``StaleRows``), metadata outside the region
refused, and nothing left in /dev/shm."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from actors.messages import BadStep, ShmRows
from actors.shm_rows import REGION_PREFIX, SHM_DIR, RowsReader, ShmRegion, StaleRows


def ours() -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith(REGION_PREFIX)}


@pytest.fixture
def pair():
    """(the verifier's region, the drafter's reader, which mapped it)."""
    before = ours()
    region = ShmRegion.create(2, 4096)
    reader = RowsReader()
    reader.open(region.name, region.nonce.hex())
    yield region, reader
    reader.close(region.name)
    region.close()
    assert ours() == before  # nothing leaked


@pytest.mark.parametrize("rows", [[2, 3, 4], [5, 0, 3], [], [7]], ids=["consecutive", "scattered", "none", "one"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_read_back_bit_for_bit(pair, rows, dtype):
    region, reader = pair
    hidden = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))  # [num_tokens, width]
    src = hidden.bfloat16().view(torch.int16) if dtype == "bfloat16" else hidden  # as it travels
    idx = np.array(rows, np.int64)
    meta = region.write(1, 1, src, idx)
    assert (meta.slot, meta.generation, meta.rows, meta.width) == (1, 1, len(rows), 16)
    got = reader.view(ShmRows.unpack(meta.pack()), dtype)  # what the drafter gets, over msgpack
    assert got.shape == (len(rows), 16) and not got.flags.writeable
    assert np.array_equal(got, src.numpy()[idx])
    reader.check_unchanged(meta)


def test_write_is_one_copy_straight_into_the_slot(pair, monkeypatch):
    """Scattered rows go by one index_select whose output is the slot itself (no intermediate array)."""
    region, _ = pair
    calls = []
    real = torch.index_select

    def spy(src, dim, index, *, out):
        calls.append(out.data_ptr())
        return real(src, dim, index, out=out)

    monkeypatch.setattr(torch, "index_select", spy)
    src = torch.randn(8, 16)
    region.write(0, 1, src, np.array([6, 1]))
    slot = region._data[0]
    assert calls == [slot.data_ptr()]


def test_a_rewritten_slot_is_stale(pair):
    region, reader = pair
    src = torch.randn(8, 16)
    first = region.write(0, 1, src, np.arange(3))
    rows = reader.view(first, "float32")  # the drafter reads generation 1 ...
    region.write(0, 3, src, np.arange(4))  # ... the slot is rewritten meanwhile
    with pytest.raises(StaleRows, match="rewritten"):
        reader.check_unchanged(first)
    with pytest.raises(StaleRows, match="holds generation 3"):  # and read again: refused up front
        reader.view(first, "float32")
    del rows


def test_a_generation_the_slot_does_not_hold_is_stale(pair):
    region, reader = pair
    meta = region.write(0, 5, torch.randn(4, 16), np.arange(2))
    for gen in (4, 6):
        wrong = ShmRows(meta.region, meta.slot, gen, meta.offset, meta.rows, meta.width)
        with pytest.raises(StaleRows, match=f"step names {gen}"):
            reader.view(wrong, "float32")


def test_a_half_written_slot_is_stale(pair):
    """``writing`` is set before the rows, ``ready`` after: a reader between them is refused."""
    region, reader = pair
    meta = region.write(0, 1, torch.randn(4, 16), np.arange(2))
    region._gens[0][0] = 2  # a writer of generation 2 mid-copy
    with pytest.raises(StaleRows, match=r"generation 1 \(writing 2\)"):
        reader.view(meta, "float32")


@pytest.mark.parametrize(("change", "reason"), [
    ({"slot": 2}, "slot 2 of a region of 2"),
    ({"slot": -1}, "slot -1"),
    ({"offset": 0}, "offset 0 is not slot 0's"),
    ({"rows": 100}, "do not fit"),
    ({"width": 0}, "do not fit"),
    ({"generation": 0}, "generation 0"),
    ({"region": REGION_PREFIX + "0" * 32}, "never opened here"),
])
def test_metadata_outside_the_region_is_refused(pair, change, reason):
    region, reader = pair
    meta = region.write(0, 1, torch.randn(4, 16), np.arange(2))
    bad = ShmRows(**{**meta.__dict__, **change})
    with pytest.raises(BadStep, match=reason):
        reader.view(bad, "float32")


def test_rows_too_big_for_a_slot_are_refused_by_the_writer(pair):
    region, _ = pair
    with pytest.raises(ValueError, match="do not fit"):
        region.write(0, 1, torch.randn(100, 16), np.arange(100))  # 6400 bytes, slot of 4096


def test_open_checks_name_and_nonce_and_unlinks():
    before = ours()
    region = ShmRegion.create(2, 64)
    reader = RowsReader()
    with pytest.raises(ValueError, match="not one this project makes"):
        reader.open("../etc/passwd", region.nonce.hex())
    with pytest.raises(ValueError, match="not the region"):
        reader.open(region.name, "00" * 16)  # another region's nonce: not the memory the verifier wrote
    assert region.name in ours()  # still there for the right drafter
    reader.open(region.name, region.nonce.hex())
    assert region.name not in ours()  # mapped at both ends: the name is gone, whoever dies first
    region.close()
    reader.close(region.name)
    assert ours() == before


def test_the_verifier_unlinks_a_region_nobody_opened():
    before = ours()
    region = ShmRegion.create(2, 64)
    assert region.name in ours()
    region.close()
    assert ours() == before
    region = ShmRegion.create(2, 64)
    del region  # garbage-collected (or the process exits): unlinked too
    assert ours() == before


def test_the_reader_keeps_a_bounded_number_of_regions():
    reader = RowsReader(max_regions=2)
    regions = [ShmRegion.create(2, 64) for _ in range(3)]
    for r in regions:
        reader.open(r.name, r.nonce.hex())
    assert list(reader.regions) == [r.name for r in regions[1:]]  # the least recently used one closed
    for r in regions:
        r.close()
        reader.close(r.name)
