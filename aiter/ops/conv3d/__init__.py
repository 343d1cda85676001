"""The conv3d family: `conv3d` with torch's semantics as an implicit GEMM, NCDHW or NDHWC."""
