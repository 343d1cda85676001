"""Proving the kernel cache by execution: small calls of aiter's public entries that reach a
listed kernel (a FlyDSL function with its compile-time parameters), run on aiter's AMDGPU
emulator and checked against torch.

`checks` holds what a check records, `reachers` the registry of per-family reachers (each
family's `reach` module) and the builder listing's kernels, `execute` runs them under
`aiter.emulated(arch)`, as the numerics suite and the builder's `--check --execute` do.
"""
