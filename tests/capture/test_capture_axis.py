"""Moving a captured argument along the axis: the layout it was captured in is kept."""

from __future__ import annotations

import pytest

from aiter.aot.flydsl.jobs.axes import CaptureError, resized


def _tensor(shape, stride):
    return {"dtype": "bfloat16", "shape": shape, "stride": stride, "device": "cuda"}


@pytest.mark.parametrize(
    "shape, stride, dim, size, expected",
    [
        ([300, 4096], [4096, 1], 0, 512, [4096, 1]),  # row-major, the outer dim moves
        ([300, 4096], [1, 300], 0, 512, [1, 512]),  # column-major
        ([8, 2000, 16, 128], [4096000, 2048, 128, 1], 1, 1025, [2099200, 2048, 128, 1]),
        ([1, 300, 4], [7, 4, 1], 1, 10, [40, 4, 1]),  # a size-1 dim's stride is free
    ],
)
def test_resized_keeps_the_dense_layout(shape, stride, dim, size, expected) -> None:
    moved = resized(_tensor(shape, stride), dim, size, "x")
    assert moved["stride"] == expected
    assert moved["shape"] == shape[:dim] + [size] + shape[dim + 1 :]


def test_a_strided_view_cannot_move() -> None:
    with pytest.raises(CaptureError, match=r"argument a \(shape \[300, 4096\], strides "):
        resized(_tensor([300, 4096], [8192, 1]), 0, 512, "a")


def test_the_axis_dim_must_exist() -> None:
    with pytest.raises(CaptureError, match="argument g has 3 dimensions, the axis is dim 3"):
        resized(_tensor([2, 3, 4], [12, 4, 1]), 3, 5, "g")


def _int_tensor(values):
    return {"dtype": "int32", "shape": [len(values)], "stride": [1], "device": "cpu",
            "values": values}  # fmt: skip


def test_a_varlen_chunk_gdn_h_batch_moves_its_total_tokens_with_its_bounds() -> None:
    from aiter.aot.flydsl.chunk_gdn_h import tokens_along

    k = {"tensor": _tensor([1, 300, 16, 128], [614400, 2048, 128, 1])}
    place = tokens_along({"k": k, "g": None, "cu_seqlens": {"tensor": _int_tensor([0, 100, 300])}})
    assert (place.axis, place.value, place.top(65536)) == ("tokens", 300, 65536)
    moved = place.at(600)
    assert moved["k"]["tensor"]["shape"] == [1, 600, 16, 128] and moved["g"] is None
    assert moved["cu_seqlens"]["tensor"]["values"] == [0, 200, 600]


def test_a_dense_chunk_gdn_h_batch_moves_its_sequence_length_within_the_tokens() -> None:
    from aiter.aot.flydsl.chunk_gdn_h import tokens_along

    k = {"tensor": _tensor([8, 2000, 16, 128], [4096000, 2048, 128, 1])}
    place = tokens_along({"k": k})
    assert (place.axis, place.value, place.top(65536)) == ("seqlen", 2000, 8192)


@pytest.mark.parametrize("host", [False, True])
def test_a_varlen_attention_call_moves_its_longest_key_sequence(host) -> None:
    from aiter.aot.flydsl.fmha_fp8 import key_length_along

    cu = _int_tensor([0, 200, 500])
    if not host:
        del cu["values"]
        cu["device"] = "cuda"
    kv = {"tensor": _tensor([500, 1, 128], [128, 128, 1])}
    arguments = {"k": kv, "v": kv, "cu_seqlens_kv": {"tensor": cu}, "max_seqlen_kv": 300}
    place = key_length_along(arguments)
    assert (place.axis, place.value) == ("seqlen_k", 300)
    moved = place.at(1000)
    assert moved["max_seqlen_kv"] == 1000
    assert moved["k"]["tensor"]["shape"] == moved["v"]["tensor"]["shape"] == [1001, 1, 128]
    assert moved["cu_seqlens_kv"]["tensor"].get("values") == ([0, 1000, 1001] if host else None)
    assert arguments["max_seqlen_kv"] == 300  # the captured call is left as it was
