"""Stacking per-request KV caches into a left-padded batch and taking rows back out."""

from __future__ import annotations

import torch

from omnictl.models.kv_batch import BatchCache


def cache_of(length: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 2, length, 4, generator=generator), torch.randn(1, 2, length, 4, generator=generator)) for _ in range(3)]


def test_stack_pads_left_and_rows_come_back_unchanged() -> None:
    caches = [cache_of(5, 1), cache_of(2, 2), cache_of(7, 3)]
    batch = BatchCache.stack(("a", "b", "c"), caches)
    assert batch.pads == [2, 5, 0]
    assert batch.cache.get_seq_length() == 7
    keys = batch.cache.layers[1].keys
    assert keys.shape == (3, 2, 7, 4)
    assert torch.count_nonzero(keys[1, :, :5]) == 0  # padding is zeros
    for row, original in enumerate(caches):
        for copy in (False, True):
            for (k, v), (k0, v0) in zip(batch.rows(row, copy=copy), original):
                assert torch.equal(k, k0) and torch.equal(v, v0)
    copied = batch.rows(0, copy=True)[0][0]
    viewed = batch.rows(0, copy=False)[0][0]
    assert copied.untyped_storage().data_ptr() != keys.untyped_storage().data_ptr()
    assert viewed.untyped_storage().data_ptr() == batch.cache.layers[0].keys.untyped_storage().data_ptr()


def test_next_step_mask_hides_padding_and_adds_the_new_position() -> None:
    batch = BatchCache.stack(("a", "b"), [cache_of(3, 1), cache_of(1, 2)])
    mask = batch.next_step_mask(torch.device("cpu"))
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
