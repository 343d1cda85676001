"""FlyDSL kernels and launchers of this family, with their index arithmetic."""
