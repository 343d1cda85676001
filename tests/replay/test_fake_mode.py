"""The dry run's fake mode makes the tensors torch's FakeTensorMode makes.

Each case runs once under torch's mode and once under DryRunFakeMode; the results must agree in
everything host code can observe: type, shape, strides, storage offset, dtype, device, which
results alias an input, and which results share storage with each other.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from aiter.aot.flydsl.dry_run import fake_mode
from aiter.aot.flydsl.dry_run.fake_mode import _FACTORY, _LIFT, _META, _SLOW, DryRunFakeMode


def _inputs() -> dict[str, torch.Tensor]:
    return {
        "a": torch.empty(6, 8, dtype=torch.bfloat16),
        "b": torch.empty(8, 5, dtype=torch.bfloat16),
        "batched": torch.empty(3, 4, 6, dtype=torch.float32),
        "ints": torch.empty(7, dtype=torch.int32),
        "scale": torch.empty(6, 1, dtype=torch.float32),
    }


CASES: dict[str, Callable[[dict[str, torch.Tensor]], object]] = {
    "empty": lambda t: torch.empty(33, 7, dtype=torch.float8_e4m3fn),
    "zeros": lambda t: torch.zeros(4, 9, dtype=torch.int32),
    "empty_strided": lambda t: torch.empty_strided((4, 6), (1, 8), dtype=torch.float16),
    "new_zeros": lambda t: t["a"].new_zeros((3, 2)),
    "new_empty": lambda t: t["ints"].new_empty(11),
    "empty_like": lambda t: torch.empty_like(t["batched"]),
    "view": lambda t: t["a"].view(2, 3, 8),
    "view_dtype": lambda t: t["a"].view(torch.int16),
    "reshape": lambda t: t["batched"].reshape(12, 6),
    "permute": lambda t: t["batched"].permute(2, 0, 1),
    "transpose_contiguous": lambda t: t["a"].t().contiguous(),
    "expand": lambda t: t["scale"].expand(6, 8),
    "slice": lambda t: t["a"][1:5, 2:],
    "select": lambda t: t["batched"][2],
    "unsqueeze": lambda t: t["ints"].unsqueeze(0),
    "flatten": lambda t: t["batched"].flatten(0, 1),
    "div_scalar": lambda t: t["scale"] / 448.0,
    "mul_broadcast": lambda t: t["a"].float() * t["scale"],
    "clamp": lambda t: t["scale"].clamp(min=1e-6),
    "abs_amax": lambda t: t["a"].abs().amax(dim=-1, keepdim=True),
    "to_dtype": lambda t: t["a"].to(torch.float8_e4m3fn),
    "bmm": lambda t: torch.bmm(t["batched"], t["batched"].transpose(1, 2)),
    "matmul": lambda t: t["a"] @ t["b"],
    "clone": lambda t: t["a"][:, ::2].clone(),
    "copy_": lambda t: t["scale"].copy_(t["scale"] * 2),
    "add_": lambda t: t["batched"].add_(1.0),
    "cumsum": lambda t: t["ints"].cumsum(0),
    "cat": lambda t: torch.cat([t["a"], t["a"]], dim=0),
    "stack": lambda t: torch.stack([t["ints"], t["ints"]]),
    "arange": lambda t: torch.arange(10, dtype=torch.int64),
    "integer_ops": lambda t: (t["ints"] + 3) // 2 % 5,
    "split": lambda t: t["a"].split(2, dim=0),
    "max_dim": lambda t: t["batched"].max(dim=1),
    "topk": lambda t: t["batched"].topk(2, dim=-1),
    "view_infer": lambda t: t["batched"].view(-1, 6),
    "view_of_transposed": lambda t: t["batched"].transpose(0, 1).view(4, 3, 2, 3),
    "view_size_one": lambda t: t["scale"].view(1, 6, 1, 1),
    "unsafe_view": lambda t: torch.ops.aten._unsafe_view(t["a"], [48]),
    "squeeze": lambda t: t["scale"].squeeze(-1),
    "flatten_all": lambda t: t["batched"].flatten(),
    "reshape_copy": lambda t: t["batched"].transpose(1, 2).reshape(3, 24),
    "unflatten": lambda t: t["ints"].unflatten(0, (7, 1)),
    "narrow": lambda t: t["a"].narrow(1, 2, 3),
    "as_strided": lambda t: t["a"].as_strided((3, 3), (8, 1), 2),
    "split_with_sizes": lambda t: t["a"].split([1, 5], dim=0),
    "unbind": lambda t: t["batched"].unbind(1),
    "movedim": lambda t: t["batched"].movedim(0, -1),
    "diagonal": lambda t: t["a"].diagonal(),
    "expand_as": lambda t: t["scale"].expand_as(t["a"]),
    "view_as": lambda t: t["a"].view_as(torch.empty(48)),
    "contiguous_of_permuted": lambda t: t["batched"].permute(2, 0, 1).contiguous(),
    "chunk": lambda t: t["batched"].chunk(2, dim=-1),
    "tensor_of_list": lambda t: torch.tensor([0, 5, 9, 13], dtype=torch.int32),
    "tensor_of_list_on_cuda": lambda t: torch.tensor([[1.0, 2.5]], device="cuda"),
    "as_tensor": lambda t: torch.as_tensor([3, 4], dtype=torch.int64, device="cuda"),
}


def _describe(value: object, inputs: list[torch.Tensor], seen: list[torch.Tensor]) -> object:
    """What host code can see of a result, with aliasing reduced to indices."""
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [_describe(v, inputs, seen) for v in value]
    if not isinstance(value, torch.Tensor):
        return value
    aliased_input = next((i for i, t in enumerate(inputs) if t is value), None)
    shares = next(
        (
            i
            for i, t in enumerate(seen)
            if t.untyped_storage()._cdata == value.untyped_storage()._cdata
        ),
        None,
    )
    seen.append(value)
    return (
        type(value).__name__,
        tuple(value.shape),
        value.stride(),
        value.storage_offset(),
        value.dtype,
        value.device,
        value._is_view(),
        value.is_contiguous(),
        aliased_input,
        shares,
    )


def _run(mode: FakeTensorMode, case: Callable[[dict[str, torch.Tensor]], object]) -> object:
    with mode:
        inputs = _inputs()
        result = case(inputs)
        tensors = list(inputs.values())
        return _describe(result, tensors, list(tensors))


@pytest.mark.parametrize("name", sorted(CASES))
def test_dry_run_mode_matches_torch(name):
    expected = _run(FakeTensorMode(allow_non_fake_inputs=False), CASES[name])
    assert _run(DryRunFakeMode(), CASES[name]) == expected  # settled, or made from a recipe
    assert _run(DryRunFakeMode(), CASES[name]) == expected  # made from a recipe


def test_fresh_outputs_are_remembered_and_aliases_are_not():
    fake_mode._recipes.clear()
    fake_mode._not_memoized.clear()
    with DryRunFakeMode():
        x = torch.empty(5, 3, dtype=torch.float32)
        first = x.abs()
        x.add_(1.0)
        x.t()
        second = x.abs()
    abs_keys = [k for k in fake_mode._recipes if k[0] is torch.ops.aten.abs.default]
    assert len(abs_keys) == 1
    assert second is not first and second.untyped_storage()._cdata != first.untyped_storage()._cdata
    assert torch.ops.aten.add_.Tensor in fake_mode._not_memoized  # returns its input
    assert torch.ops.aten.t.default in fake_mode._not_memoized  # a view


def test_results_are_fakes_of_the_mode():
    mode = DryRunFakeMode()
    with mode:
        out = torch.empty(4, 4, dtype=torch.float32).abs()
    assert isinstance(out, FakeTensor) and out.fake_mode is mode


def test_a_recipe_follows_the_default_dtype():
    """An integer division's dtype is the default dtype: a recipe made under one is not used
    under another."""
    with DryRunFakeMode():
        ints = torch.empty(3, dtype=torch.int32)
        assert (ints / 2).dtype == torch.float32
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            assert (ints / 2).dtype == torch.float64
        finally:
            torch.set_default_dtype(previous)


def test_ops_take_the_direct_path():
    """Guards the point of the mode: the ops of a probe are settled without torch's general
    machinery. A torch upgrade that changes a route fails here rather than slowing builds."""
    with DryRunFakeMode():
        x = torch.empty(4, 8, dtype=torch.bfloat16)
        x.abs().view(8, 4)
        torch.zeros(3, dtype=torch.int32)
    routes = fake_mode._routes
    empty = torch.ops.aten.empty.memory_format
    # Factories of no tensor argument skip the argument walk; a zeros is an empty on meta.
    assert routes[empty] == (_FACTORY, (empty, True))
    assert routes[torch.ops.aten.zeros.default] == (_FACTORY, (empty, True))
    assert routes[torch.ops.aten.abs.default][0] == _META
    assert routes[torch.ops.aten.view.default][0] != _SLOW


def test_a_lifted_host_tensor_is_made_from_its_metadata_and_remembered(monkeypatch):
    """`torch.tensor(data)` lifts a fresh host tensor: made without torch's converter, the same
    real tensor lifted twice is one fake (as the converter remembers it); a view is left to it."""
    mode = DryRunFakeMode()
    real = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], dtype=torch.int32)
    rows = real[1:]
    converter = mode.fake_tensor_converter
    torch_lift = converter.from_real_tensor

    def refused(*args, **kwargs):
        raise AssertionError("a plain host tensor took torch's converter")

    monkeypatch.setattr(converter, "from_real_tensor", refused)
    with mode:
        first = torch.ops.aten.lift_fresh.default(real)
        again = torch.ops.aten.lift_fresh.default(real)
    monkeypatch.setattr(converter, "from_real_tensor", torch_lift)
    with mode:
        view = torch.ops.aten.lift_fresh.default(rows)
    assert fake_mode._routes[torch.ops.aten.lift_fresh.default][0] == _LIFT
    assert first is again and isinstance(first, FakeTensor) and first.fake_mode is mode
    described = (first.shape, first.stride(), first.dtype, first.device, first.constant)
    assert described == (real.shape, real.stride(), real.dtype, real.device, None)
    with FakeTensorMode(allow_non_fake_inputs=False):
        expected = torch.ops.aten.lift_fresh.default(rows)
    assert (view.shape, view.stride(), view.storage_offset()) == (
        expected.shape,
        expected.stride(),
        expected.storage_offset(),
    )


def test_real_tensor_inputs_are_refused_as_by_torch():
    real = torch.ones(3)
    with DryRunFakeMode(), pytest.raises(Exception, match="convert all Tensors to FakeTensors"):
        torch.ops.aten.abs.default(real)


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0"])
def test_fakes_are_made_as_torch_makes_them(device):
    """`new_fake` skips torch's constructor after the first fake on a device: what it makes must
    be what the constructor would have made, attributes and dispatch keys alike."""
    mode = DryRunFakeMode()
    made = [mode.new_fake(torch.empty(3, 5, device="meta"), device) for _ in range(3)]
    reference = FakeTensor(mode, torch.empty(3, 5, device="meta"), device)
    for fake in made:
        assert type(fake) is FakeTensor
        assert vars(fake) == vars(reference)
        assert torch._C._dispatch_keys(fake) == torch._C._dispatch_keys(reference)
        assert fake.device == reference.device and fake.requires_grad == reference.requires_grad
    made[1].nonzero_memo = 7  # each fake owns its attributes
    assert made[2].nonzero_memo is None


@pytest.mark.parametrize("allow", [True, False])
def test_made_fakes_guard_data_pointers_as_torch_does(allow):
    mode = DryRunFakeMode()
    mode._allow_unsafe_data_ptr_access = allow
    mode.new_fake(torch.empty(2, device="meta"), "cpu")
    later = mode.new_fake(torch.empty(2, device="meta"), "cpu")
    reference = FakeTensor(mode, torch.empty(2, device="meta"), "cpu")
    for fake in (later, reference):
        if allow:  # a deprecation warning, at most once per process
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fake.untyped_storage().data_ptr()
        else:
            with pytest.raises(RuntimeError, match="data pointer"):
                fake.untyped_storage().data_ptr()


def test_every_dry_run_of_a_process_enters_its_one_mode():
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run

    made = []
    for _ in range(2):
        with dry_run("gfx942", 304, bridge.MODE_NAME):
            made.append(torch.empty(4, device="cuda"))
    assert made[0].fake_mode is made[1].fake_mode is fake_mode.process_mode()


def _sized_inputs(m: int, k: int) -> dict[str, torch.Tensor]:
    return {
        "x": torch.empty(m, k, dtype=torch.bfloat16),
        "col": torch.empty(m, 1, dtype=torch.float32),
        "row": torch.empty(k, dtype=torch.bfloat16),
        "ints": torch.empty(m, dtype=torch.int32),
    }


SIZED_CASES: dict[str, Callable[[dict[str, torch.Tensor]], object]] = {
    "abs": lambda t: t["x"].abs(),
    "amax_keepdim": lambda t: t["x"].abs().amax(dim=-1, keepdim=True),
    "per_token_quant": lambda t: (
        t["x"] / (t["x"].abs().amax(-1, keepdim=True).float().clamp(min=1e-10) / 448.0)
    ).to(torch.float8_e4m3fn),
    "broadcast_column": lambda t: t["x"].float() * t["col"],
    "broadcast_row": lambda t: t["x"] + t["row"],
    "sum_dim0": lambda t: t["x"].sum(0),
    "mean_all": lambda t: t["x"].float().mean(),
    "where": lambda t: torch.where(t["x"] > 0, t["x"], t["row"]),
    "int_to_float": lambda t: t["ints"].sigmoid(),
    "column_plus_row": lambda t: t["col"] + t["row"].float(),
    "to_dtype": lambda t: t["x"].to(torch.float32),
    "to_fp8_column": lambda t: t["col"].to(torch.float8_e4m3fnuz),
}
SIZE_PAIRS = [
    ((5, 8), (9, 8)),
    ((5, 8), (1, 8)),
    ((6, 6), (7, 7)),
    ((6, 7), (7, 6)),
    ((3, 4), (0, 4)),
]


def _run_sized(mode: FakeTensorMode, case, size: tuple[int, int]) -> object:
    with mode:
        inputs = _sized_inputs(*size)
        tensors = list(inputs.values())
        return _describe(case(inputs), tensors, list(tensors))


@pytest.mark.parametrize("sizes", SIZE_PAIRS, ids=str)
@pytest.mark.parametrize("name", sorted(SIZED_CASES))
def test_size_free_recipes_match_torch_at_other_sizes(name, sizes):
    """A recipe kept with its sizes as symbols, made at other sizes, gives what torch's mode
    gives there."""
    fake_mode._size_free_recipes.clear()
    first, second = sizes
    mode = DryRunFakeMode()
    assert _run_sized(mode, SIZED_CASES[name], first) == _run_sized(
        FakeTensorMode(allow_non_fake_inputs=False), SIZED_CASES[name], first
    )
    expected = _run_sized(FakeTensorMode(allow_non_fake_inputs=False), SIZED_CASES[name], second)
    assert _run_sized(mode, SIZED_CASES[name], second) == expected


def test_a_size_free_recipe_serves_new_sizes_and_not_other_patterns():
    fake_mode._size_free_recipes.clear()
    with DryRunFakeMode():
        torch.empty(5, 8, dtype=torch.bfloat16) + torch.empty(8, dtype=torch.bfloat16)
        made = torch.empty(9, 16, dtype=torch.bfloat16) + torch.empty(16, dtype=torch.bfloat16)
        assert made.shape == (9, 16) and made.stride() == (16, 1)
        add = [k for k in fake_mode._size_free_recipes if k[0] is torch.ops.aten.add.Tensor]
        assert len(add) == 1  # one pattern served both calls
        with pytest.raises(RuntimeError, match="broadcast"):
            torch.empty(5, 8, dtype=torch.bfloat16) + torch.empty(7, dtype=torch.bfloat16)
        torch.empty(8, 5, dtype=torch.bfloat16).t().abs()  # strides not contiguous: none kept
    abs_ops = [k for k in fake_mode._size_free_recipes if k[0] is torch.ops.aten.abs.default]
    assert abs_ops == []
