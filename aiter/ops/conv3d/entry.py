"""Public conv3d entry with torch's semantics, for video VAEs and patch embeddings: validate, serve
1x1x1 convs as a GEMM, look the shape up, prepare a padded NDHWC input and packed weight, launch.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence

import torch

from aiter import capture, device, dispatch, jit_monitor
from aiter.ops.conv3d import plan as conv3d_plan
from aiter.ops.conv3d import table as conv3d_table
from aiter.ops.conv3d.table import LAYOUTS

__all__ = ["conv3d"]

INPUT_DTYPES = tuple(getattr(torch, name) for name in conv3d_table.INPUT_DTYPES)


def _triple(name: str, value: int | Sequence[int], minimum: int) -> tuple[int, int, int]:
    values = (value,) * 3 if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        values = tuple(values)
    except TypeError:
        raise TypeError(f"{name} must be an int or a triple of ints, got {value!r}") from None
    if len(values) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TypeError(f"{name} must be an int or a triple of ints, got {value!r}")
    if any(v < minimum for v in values):
        raise ValueError(f"{name} values must be >= {minimum}, got {value!r}")
    return values  # type: ignore[return-value]


def _tensor(name: str, t: object, dtypes: tuple[torch.dtype, ...], dims: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {dtypes}, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be a {dims}-D tensor, got shape {list(t.shape)}")
    if not device.on_gpu(t):
        raise ValueError(f"{name} must be on a GPU device, got {t.device}")
    return t


# Packed weights, one per weight tensor (and version and groups): packing reads the whole
# weight, so it runs once; the entry dies with its tensor.
_packed: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}


def _packed_weight(weight: torch.Tensor, groups: int) -> torch.Tensor:
    from aiter.ops.conv3d.kernels.implicit_gemm import pack_conv3d_weight

    key = id(weight)
    held = _packed.get(key)
    if held is not None and held[0]() is weight and held[1:3] == (weight._version, groups):
        return held[3]
    packed = pack_conv3d_weight(weight, groups)
    _packed[key] = (weakref.ref(weight, lambda _, k=key: _packed.pop(k, None)), weight._version,
                    groups, packed)  # fmt: skip
    return packed


def _to_layout(y_ndhwc: torch.Tensor, layout: str) -> torch.Tensor:
    """A contiguous tensor in `layout` from a [N, D, H, W, K] tensor (fake-tensor safe)."""
    if layout == "NDHWC":
        return y_ndhwc
    y = y_ndhwc.permute(0, 4, 1, 2, 3)
    return torch.ops.aten.clone.default(y, memory_format=torch.contiguous_format)


def _as_gemm(x_ndhwc, weight, bias, output_layout) -> torch.Tensor:
    """A 1x1x1, unit-stride, unpadded, ungrouped conv: [N, D, H, W, C] @ W[K, C]^T (+ bias)."""
    w = weight.view(weight.shape[0], weight.shape[1])
    y = torch.matmul(x_ndhwc, w.mT)
    if bias is not None:
        y = y + bias
    return _to_layout(y, output_layout)


@capture.entry("conv3d")
def conv3d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    input_layout: str = "NCDHW",
    output_layout: str = "NCDHW",
) -> torch.Tensor:
    """torch.nn.functional.conv3d (zeros padding) on bf16/fp16, in either memory layout.

    x is [N, C, D, H, W] ("NCDHW") or [N, D, H, W, C] ("NDHWC"); weight [K, C / groups, kT, kH,
    kW] and bias [K] in x's dtype; stride, padding and dilation are ints or triples. Returns
    [N, K, D', H', W'] or [N, D', H', W', K] as output_layout says. 1x1x1 unit-stride unpadded
    ungrouped convs are served by torch.matmul; the rest by the FlyDSL implicit-GEMM kernel the
    tuned table (bf16_tuned_conv3d.csv) or the heuristic chooses.
    """
    from aiter.ops.conv3d.kernels.implicit_gemm import Conv3dGeometry

    for name, layout in (("input_layout", input_layout), ("output_layout", output_layout)):
        if layout not in LAYOUTS:
            raise ValueError(f"{name} must be one of {LAYOUTS}, got {layout!r}")
    x = _tensor("x", x, INPUT_DTYPES, 5)
    weight = _tensor("weight", weight, (x.dtype,), 5)
    if bias is not None:
        bias = _tensor("bias", bias, (x.dtype,), 1)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    stride = _triple("stride", stride, 1)
    padding = _triple("padding", padding, 0)
    dilation = _triple("dilation", dilation, 1)
    if input_layout == "NCDHW":
        n, c, d, h, w = (int(v) for v in x.shape)
    else:
        n, d, h, w, c = (int(v) for v in x.shape)
    k, cg, kt, kh, kw = (int(v) for v in weight.shape)
    if c % groups or k % groups:
        raise ValueError(
            f"groups = {groups} must divide the input channels ({c}) and output channels ({k})"
        )
    if cg != c // groups:
        raise ValueError(
            f"weight must be [K, C / groups = {c // groups}, kT, kH, kW], got {list(weight.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (k,):
        raise ValueError(f"bias must have shape [{k}], got {list(bias.shape)}")
    geometry = Conv3dGeometry(
        n=n, c=c, d=d, h=h, w=w, k=k, kt=kt, kh=kh, kw=kw, stride=stride, padding=padding,
        dilation=dilation, groups=groups,
    )  # fmt: skip
    x_ndhwc = x if input_layout == "NDHWC" else x.permute(0, 2, 3, 4, 1)

    def args() -> dict[str, str]:
        return {
            "x": dispatch.tensor_arg(x, input_layout),
            "weight": dispatch.tensor_arg(weight),
            "bias": dispatch.tensor_arg(bias),
            "stride": str(stride),
            "padding": str(padding),
            "dilation": str(dilation),
            "groups": str(groups),
            "output_layout": output_layout,
        }

    if (kt, kh, kw) == (1, 1, 1) and stride == (1, 1, 1) and padding == (0, 0, 0) and groups == 1:
        dispatch.report(
            lambda: dispatch.DispatchRecord(
                conv3d_plan.OP, dispatch.BACKEND_TORCH, None, "heuristic", None,
                {"reason": "a 1x1x1 unit-stride unpadded ungrouped conv is a GEMM (torch.matmul)"},
                args=args(),
            )  # fmt: skip
        )
        return _as_gemm(x_ndhwc, weight, bias, output_layout)

    served = conv3d_plan.plan(geometry, bias is not None)
    if served.use_torch:
        served.report(args)
        x_ncdhw = x if input_layout == "NCDHW" else x.permute(0, 4, 1, 2, 3)
        y = torch.nn.functional.conv3d(x_ncdhw, weight, bias, stride, padding, dilation, groups)
        return _to_layout(y.permute(0, 2, 3, 4, 1), output_layout)
    return _launch(x, input_layout, weight, bias, geometry, served, output_layout, args)


def _input_route(x: torch.Tensor, input_layout: str, groups: int) -> str:
    """How x becomes what the kernel reads (contiguous NDHWC, channels padded per group)."""
    from aiter.ops.conv3d.kernels import implicit_gemm as kernels

    if input_layout == "NDHWC" and kernels.ndhwc_input_ready(x, groups):
        return "as is"
    if (
        input_layout == "NCDHW"
        and x.is_contiguous()
        and kernels.pretranspose_supported(tuple(x.shape), groups)
    ):
        return "pre-transpose kernel"
    return "torch permute"


def _padded_input(x: torch.Tensor, input_layout: str, groups: int, route: str) -> torch.Tensor:
    """x as the kernel reads it, prepared as `route` (from _input_route) says."""
    from aiter.ops.conv3d.kernels import implicit_gemm as kernels

    if route == "as is":
        return x
    if route == "pre-transpose kernel":
        n, c, d, h, w = (int(v) for v in x.shape)
        cgp = kernels.padded_channels(c // groups)
        out = torch.empty((n, d, h, w, groups * cgp), dtype=x.dtype, device=x.device)
        kernels.launch_conv3d_pretranspose(x, out, groups=groups, stream=device.current_stream())
        return out
    return kernels.to_padded_ndhwc_torch(x, groups, input_layout)


def _launch(x, input_layout, weight, bias, geometry, served, output_layout, args) -> torch.Tensor:
    from aiter.ops.conv3d.kernels import implicit_gemm as kernels

    g = geometry
    packed_weight = _packed_weight(weight, g.groups)

    def launch(choice: conv3d_plan.ConvChoice, x_padded: torch.Tensor) -> torch.Tensor:
        out = torch.empty(g.out_shape(output_layout), dtype=x.dtype, device=x.device)
        workspace = None
        if choice.split_k > 1:
            workspace = torch.empty(
                kernels.conv3d_workspace_shape(g, choice.split_k),
                dtype=kernels.WORKSPACE_DTYPE,
                device=x.device,
            )
        kernels.launch_conv3d(
            x_padded,
            packed_weight,
            bias,
            out,
            workspace,
            geometry=g,
            tile=choice.tile,
            split_k=choice.split_k,
            output_layout=output_layout,
            mma=choice.mma,
            stream=device.current_stream(),
        )
        return out

    if jit_monitor.settings().fallback:
        # Naming needs only the input's shape: a stand-in, so the pre-transpose runs once.
        stand_in = torch.empty(g.x_padded_shape(), dtype=x.dtype, device=x.device)
        served = _cached_variant(served, g, bias is not None, x.dtype, output_layout,
                                 lambda choice: launch(choice, stand_in))  # fmt: skip
    # Reported before the pre-transpose kernel launches: a miss there names this call.
    how = _input_route(x, input_layout, g.groups)
    served.report(args, input=how, output_layout=output_layout)
    return launch(served.choice, _padded_input(x, input_layout, g.groups, how))


def _cached_variant(served, geometry, has_bias, dtype, output_layout, launch):
    """`served` when the cache holds its kernels, else the plan of the first equivalent choice
    it holds (logged once), else `served` (the JIT policy then decides)."""
    planned = served.choice
    cu_num = device.cu_num()
    variants = conv3d_plan.equivalent_choices(planned, geometry, cu_num)
    signature = (device.arch(), cu_num, geometry, has_bias, dtype, output_layout)
    choice = jit_monitor.cached_equivalent(
        conv3d_plan.OP, signature, planned, variants, launch, conv3d_plan.describe
    )
    if choice == planned:
        return served
    return dataclasses.replace(served, choice=choice, planned=planned)
