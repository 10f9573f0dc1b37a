"""Per-request KV caches stacked into one left-padded batch cache, and taken apart again.

Requests of different lengths decode together by left-padding every request's keys and
values to the longest; the attention mask hides the padding. Padded positions hold
zeros and are masked, so they add exact zeros to attention and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of shape [1, heads, length, head_dim]


@dataclass(slots=True)
class BatchCache:
    request_ids: tuple[str, ...]
    cache: DynamicCache
    pads: list[int]  # left padding of each row

    @classmethod
    def stack(cls, request_ids: tuple[str, ...], caches: Sequence[KV]) -> BatchCache:
        """One batch cache from per-request caches (each of batch size one)."""
        lengths = [cache[0][0].shape[2] for cache in caches]
        longest = max(lengths)
        pads = [longest - length for length in lengths]
        layers = []
        for layer in range(len(caches[0])):
            keys = torch.cat([_left_padded(cache[layer][0], pad) for cache, pad in zip(caches, pads)])
            values = torch.cat([_left_padded(cache[layer][1], pad) for cache, pad in zip(caches, pads)])
            layers.append((keys, values))
        return cls(request_ids, DynamicCache(ddp_cache_data=layers), pads)

    def rows(self, row: int, *, copy: bool) -> KV:
        """Row ``row``'s cache without its padding; ``copy`` detaches it from this batch's memory."""
        pad = self.pads[row]
        taken = []
        for keys, values in kv_layers(self.cache):
            row_keys, row_values = keys[row : row + 1, :, pad:], values[row : row + 1, :, pad:]
            taken.append((row_keys.clone(), row_values.clone()) if copy else (row_keys, row_values))
        return taken

    def next_step_mask(self, device: torch.device) -> torch.Tensor:
        """Attention mask ``[batch, cached + 1]`` for the next one-token step: zeros on padding."""
        total = self.cache.get_seq_length()
        mask = torch.ones(len(self.request_ids), total + 1, dtype=torch.long, device=device)
        for row, pad in enumerate(self.pads):
            mask[row, :pad] = 0
        return mask


def kv_layers(cache: DynamicCache) -> KV:
    """Keys and values of every layer (full-attention layers only)."""
    layers = []
    for index, layer in enumerate(cache.layers):
        if not isinstance(layer, DynamicLayer) or layer.keys is None or layer.values is None:
            raise RuntimeError(f"KV cache layer {index} is {type(layer).__name__} without keys/values (internal error)")
        layers.append((layer.keys, layer.values))
    return layers


def _left_padded(tensor: torch.Tensor, pad: int) -> torch.Tensor:
    if pad == 0:
        return tensor
    shape = list(tensor.shape)
    shape[2] = pad
    return torch.cat([tensor.new_zeros(shape), tensor], dim=2)
