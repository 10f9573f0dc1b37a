from __future__ import annotations

import numpy as np
import pytest
import torch

from omnictl.exceptions import UnsupportedPayload
from omnictl.transports.packing import copy_containers, pack, unpack


def roundtrip(data):
    packed = pack(data)
    return unpack(packed.skeleton, packed.layout, packed.to_bytes()), packed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_torch_leaves_keep_dtype_shape_and_values(dtype: torch.dtype) -> None:
    tensor = (torch.arange(24).reshape(2, 3, 4) % 3).to(dtype)
    out, packed = roundtrip({"t": tensor})
    assert out["t"].dtype == dtype and out["t"].shape == (2, 3, 4)
    assert torch.equal(out["t"], tensor)
    assert [entry.dtype for entry in packed.layout] == [str(dtype).removeprefix("torch.")]


def test_numpy_leaves_nested_in_lists_and_dicts() -> None:
    data = {"a": [np.arange(5, dtype=np.int16), {"b": np.ones((2, 2), dtype=np.float64)}], "s": "text", "n": 3}
    out, packed = roundtrip(data)
    np.testing.assert_array_equal(out["a"][0], data["a"][0])
    assert out["a"][0].dtype == np.int16
    np.testing.assert_array_equal(out["a"][1]["b"], np.ones((2, 2)))
    assert out["s"] == "text" and out["n"] == 3
    assert len(packed.layout) == 2 and packed.layout[1].offset % 64 == 0


def test_non_contiguous_and_empty_tensors() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    out, _ = roundtrip({"t": base.t(), "e": torch.empty(0, 7)})
    assert torch.equal(out["t"], base.t())
    assert out["e"].shape == (0, 7)


def test_unpacked_tensors_do_not_alias_the_buffer() -> None:
    packed = pack({"t": torch.ones(4)})
    buffer = bytearray(packed.to_bytes())
    out = unpack(packed.skeleton, packed.layout, memoryview(buffer))
    buffer[:] = bytes(len(buffer))
    assert torch.equal(out["t"], torch.ones(4))


def test_other_objects_are_refused_naming_path_and_type_unless_pickle_is_allowed() -> None:
    data = {"ok": [1, "two", None, np.float32(0.5)], "c": [complex(1, 2)]}
    with pytest.raises(UnsupportedPayload) as caught:
        pack(data)
    assert caught.value.path == "['c'][0]" and caught.value.type_name == "builtins.complex"
    assert "['c'][0]: a builtins.complex cannot travel" in str(caught.value)
    packed = pack(data, allow_pickle=True)
    with pytest.raises(UnsupportedPayload, match="allow_pickle"):
        unpack(packed.skeleton, packed.layout, packed.to_bytes())  # a receiver that did not opt in
    out = unpack(packed.skeleton, packed.layout, packed.to_bytes(), allow_pickle=True)
    assert out == {"ok": [1, "two", None, 0.5], "c": [complex(1, 2)]}


def test_copy_containers_shares_leaves_but_not_containers() -> None:
    leaf = torch.ones(2)
    data = {"x": [leaf, {"y": 1}]}
    copy = copy_containers(data)
    copy["x"].append("mutated")
    copy["x"][1]["y"] = 2
    assert data == {"x": [leaf, {"y": 1}]}
    assert copy["x"][0] is leaf
