from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from omnictl.outputs import AudioChunk, TextResult
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


def test_copy_containers_copies_what_tuples_hold() -> None:
    leaf = torch.ones(2)
    data = {"pair": ([1], leaf, ("deep", {"k": 1}))}
    copy = copy_containers(data)
    assert copy == data and type(copy["pair"]) is tuple and type(copy["pair"][2]) is tuple
    assert copy["pair"][1] is leaf
    copy["pair"][0].append(2)
    copy["pair"][2][1]["k"] = 2
    assert data == {"pair": ([1], leaf, ("deep", {"k": 1}))}


class _OnDevice:
    """Stands in for a CUDA tensor: only its ``is_cuda`` flag matters to pack()."""

    is_cuda = True

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _OnDevice) and other.name == self.name


def test_device_leaves_go_through_device_leaf_and_host_ones_do_not() -> None:
    handed: list[object] = []

    def device_leaf(obj: object) -> bytes:
        handed.append(obj)
        return pickle.dumps(("ipc-handle", obj.name))  # type: ignore[attr-defined]

    gpu, cpu = _OnDevice("g"), torch.arange(3)
    packed = pack({"gpu": gpu, "cpu": cpu}, device_leaf=device_leaf)
    assert handed == [gpu]
    out = unpack(packed.skeleton, packed.layout, packed.to_bytes())
    assert out["gpu"] == ("ipc-handle", "g") and torch.equal(out["cpu"], cpu)
    assert [entry.index for entry in packed.layout] == [0]
    # Without a device_leaf, the same object is pickled whole (host memory), when allowed.
    packed = pack({"gpu": gpu}, allow_pickle=True)
    assert unpack(packed.skeleton, packed.layout, packed.to_bytes(), allow_pickle=True) == {"gpu": gpu}


def test_typed_outputs_keep_their_type_and_their_arrays_share_the_tensor_layout() -> None:
    chunk = AudioChunk(samples=np.linspace(-1, 1, 300, dtype=np.float32), sample_rate=16000, transcript="hi")
    data = {"results": [TextResult(text="a", prompt_tokens=2), chunk], "ids": torch.arange(5)}
    out, packed = roundtrip(data)
    text, audio = out["results"]
    assert text == TextResult(text="a", prompt_tokens=2)
    assert type(audio) is AudioChunk and (audio.sample_rate, audio.transcript) == (16000, "hi")
    np.testing.assert_array_equal(audio.samples, chunk.samples)
    assert torch.equal(out["ids"], torch.arange(5))
    assert [entry.index for entry in packed.layout] == [0, 1]  # one buffer for both arrays
    assert packed.nbytes >= chunk.samples.nbytes + 5 * 8


def test_many_tensors_are_each_found_again_by_index() -> None:
    data = [torch.full((2,), i) for i in range(300)]  # indices past one byte
    out, packed = roundtrip(data)
    assert [int(t[0]) for t in out] == list(range(300))
    assert [entry.index for entry in packed.layout] == list(range(300))


def test_an_unsupported_leaf_inside_a_typed_output_is_named_by_its_field_path() -> None:
    from omnictl.outputs import TokenResult

    with pytest.raises(UnsupportedPayload) as caught:
        pack({"r": [1, TokenResult(text="a", hidden={"deep": complex(1, 2)})]})
    assert caught.value.path == "['r'][1].hidden['deep']"
    with pytest.raises(UnsupportedPayload) as caught:
        pack(complex(1, 2))  # the whole payload is the culprit
    assert caught.value.path == "(the payload itself)"
    assert str(caught.value).startswith("(the payload itself): a builtins.complex cannot travel")


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float16])
def test_an_empty_tensor_keeps_its_dtype_and_shape(dtype: torch.dtype) -> None:
    out, _ = roundtrip({"e": torch.empty(0, 3, dtype=dtype)})
    assert out["e"].dtype == dtype and out["e"].shape == (0, 3)


def test_with_a_device_leaf_host_arrays_and_plain_objects_still_travel_as_host_data() -> None:
    handed: list[object] = []

    def device_leaf(obj: object) -> bytes:
        handed.append(obj)
        return b""

    data = {"a": np.arange(3), "t": torch.ones(2), "r": TextResult(text="x")}
    packed = pack(data, device_leaf=device_leaf)  # objects without an is_cuda flag are not GPU tensors
    assert handed == [] and [entry.kind for entry in packed.layout] == ["numpy", "torch"]
    out = unpack(packed.skeleton, packed.layout, packed.to_bytes())
    assert out["a"].tolist() == [0, 1, 2] and out["t"].tolist() == [1.0, 1.0] and out["r"] == TextResult(text="x")


def test_the_refusal_says_what_may_travel_and_how_to_opt_in() -> None:
    with pytest.raises(UnsupportedPayload) as caught:
        pack({"c": complex(1, 2)})
    assert str(caught.value) == (
        "['c']: a builtins.complex cannot travel between processes; send tensors, arrays, bytes, str, numbers, "
        "bools, None, lists, dicts or typed outputs (or set `allow_pickle: true` in the topology, for trusted "
        "hosts only)")


def test_an_unsupported_object_found_nowhere_among_the_values_has_an_unknown_path() -> None:
    with pytest.raises(UnsupportedPayload) as caught:
        pack({complex(1, 2): "a key, not a value"})
    assert caught.value.path == "(unknown path)"
