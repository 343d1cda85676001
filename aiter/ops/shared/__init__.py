"""What several families' kernels share: the GEMM index arithmetic and building blocks, the MMA
steps, tiles, the preshuffled weight layout and the launchers' argument checks."""
