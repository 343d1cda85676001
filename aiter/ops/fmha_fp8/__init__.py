"""The fp8 attention family (fmha_fp8): `flash_attn_fp8`, the prefill forward, dense or varlen."""
