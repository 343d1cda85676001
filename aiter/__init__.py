"""aiter: FlyDSL GPU operators for AMD Instinct GPUs, with a CPU-only AOT kernel-cache builder."""

from aiter import cache_location as _cache_location
from aiter.version import __version__  # noqa: F401  (aiter.__version__)

# Serve from the cache a wheel ships, unless the user named one; before FlyDSL is imported.
_cache_location.configure()

# Public name -> the family entry module that defines it. Operators import torch and FlyDSL:
# they load on first use so that `import aiter` stays light.
_ENTRIES = {
    "gemm_a16w16": "aiter.ops.gemm.entry",
    "gemm_a8w8_bpreshuffle": "aiter.ops.gemm.entry",
    "gemm_a8w8_blockscale": "aiter.ops.gemm.entry",
    "gemm_a8w8_blockscale_bpreshuffle": "aiter.ops.gemm.entry",
    "shuffle_weight": "aiter.ops.gemm.entry",
    "unshuffle_weight": "aiter.ops.gemm.entry",
    "gemm_a4w4": "aiter.ops.gemm.mx_entry",
    "gemm_mxfp8": "aiter.ops.gemm.mx_entry",
    "shuffle_mx_scale": "aiter.ops.gemm.mx_entry",
    "unshuffle_mx_scale": "aiter.ops.gemm.mx_entry",
    "mxfp4_quantize": "aiter.ops.gemm.microscale",
    "mxfp8_quantize": "aiter.ops.gemm.microscale",
    "mx_dequantize": "aiter.ops.gemm.microscale",
    "fused_topk": "aiter.ops.moe.entry",
    "grouped_topk": "aiter.ops.moe.routing_entry",
    "biased_grouped_topk": "aiter.ops.moe.routing_entry",
    "moe_sorting": "aiter.ops.moe.entry",
    "fused_moe": "aiter.ops.moe.entry",
    "conv3d": "aiter.ops.conv3d.entry",
    "flash_attn_fp8": "aiter.ops.fmha_fp8.entry",
    "chunk_gated_delta_rule_fwd_h": "aiter.ops.chunk_gdn_h.entry",
    # Not an operator: the context that runs the operators on CPU tensors in the emulator.
    "emulated": "aiter.emulation",
}


def __getattr__(name: str):
    module = _ENTRIES.get(name)
    if module is None:
        raise AttributeError(f"module 'aiter' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
