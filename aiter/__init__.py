"""aiter: FlyDSL GPU operators for AMD Instinct GPUs, with a CPU-only AOT kernel-cache builder."""

__version__ = "0.1.0"

from aiter import cache_location as _cache_location  # noqa: E402

# Serve from the cache a wheel ships, unless the user named one; before FlyDSL is imported.
_cache_location.configure()


_A8W8 = ("gemm_a8w8_bpreshuffle", "gemm_a8w8_blockscale", "shuffle_weight", "unshuffle_weight")
_MOE = ("fused_moe", "fused_topk", "moe_sorting")


def __getattr__(name: str):
    # Operators import torch and FlyDSL; load them on first use so `import aiter` stays light.
    if name == "gemm_a16w16":
        from aiter.ops.gemm_a16w16 import gemm_a16w16

        return gemm_a16w16
    if name in _A8W8:
        from aiter.ops import gemm_a8w8

        return getattr(gemm_a8w8, name)
    if name == "flash_attn_fp8":
        from aiter.ops.attention import flash_attn_fp8

        return flash_attn_fp8
    if name == "conv3d":
        from aiter.ops.conv3d import conv3d

        return conv3d
    if name in _MOE:
        from aiter.ops import moe

        return getattr(moe, name)
    raise AttributeError(f"module 'aiter' has no attribute {name!r}")
