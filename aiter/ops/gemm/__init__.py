"""The GEMM family: bf16/fp16 (`gemm_a16w16`), fp8/int8 with a preshuffled weight
(`gemm_a8w8_bpreshuffle`) and DeepSeek-V3 block-scaled fp8 (`gemm_a8w8_blockscale`)."""
