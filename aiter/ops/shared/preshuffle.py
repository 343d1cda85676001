"""The preshuffled weight layout of the 8-bit GEMM kernels (gemm a8w8 bpreshuffle and the fp8
MoE stages), in pure torch: shuffle_weight and its inverse.
"""

from __future__ import annotations

import torch


def _check_layout(w: torch.Tensor, layout: tuple[int, int]) -> tuple[int, int, int, int]:
    if (
        not isinstance(layout, tuple)
        or len(layout) != 2
        or not all(isinstance(v, int) and v > 0 for v in layout)
    ):
        raise ValueError(f"layout: expected a pair of positive ints, got {layout!r}")
    if w.dim() < 2:
        raise ValueError(f"w: expected a [..., N, K] tensor, got shape {list(w.shape)}")
    n, k = (int(d) for d in w.shape[-2:])
    ln, lk = layout
    if n % ln:
        raise ValueError(f"w: N = w.shape[-2] = {n} must be a multiple of layout[0] = {ln}")
    if k % lk:
        raise ValueError(f"w: K = w.shape[-1] = {k} must be a multiple of layout[1] = {lk}")
    return n, k, ln, lk


def shuffle_weight(w: torch.Tensor, layout: tuple[int, int] = (16, 16)) -> torch.Tensor:
    """Preshuffle a [N, K] weight (or a stack [..., N, K], e.g. MoE experts, each slab shuffled
    on its own) for the preshuffled-weight kernels; returns a contiguous tensor of w's shape.

    With layout (ln, lk), W is viewed as [N / ln, ln, K / lk, lk] and permuted to
    [N / ln, K / lk, ln, lk]: each group of ln rows stores its K as chunks of lk contiguous
    elements per row, the ln rows of one chunk next to each other. W[n, k] lands at flat offset
    ((n // ln) * (K / lk) + k // lk) * ln * lk + (n % ln) * lk + k % lk
    (gemm_a8w8_index.shuffled_offset). The kernel reads BPRESHUFFLE_LAYOUT = (16, 16): a 16-byte
    chunk is one lane's K run of an MFMA k-block (half of a WMMA lane's 32-byte run), and the
    64 (32) lanes of one load instruction read 1 KiB (512 B) of contiguous memory.
    Raises ValueError unless N % layout[0] == 0 and K % layout[1] == 0.
    """
    n, k, ln, lk = _check_layout(w, layout)
    rows = w.numel() // k  # leading dims (experts) stack whole groups of ln rows
    shuffled = w.reshape(rows // ln, ln, k // lk, lk).permute(0, 2, 1, 3).contiguous()
    return shuffled.view(w.shape)


def unshuffle_weight(w: torch.Tensor, layout: tuple[int, int] = (16, 16)) -> torch.Tensor:
    """Inverse of shuffle_weight: the row-major [..., N, K] weight from its preshuffled form."""
    n, k, ln, lk = _check_layout(w, layout)
    rows = w.numel() // k
    plain = w.reshape(rows // ln, k // lk, ln, lk).permute(0, 2, 1, 3).contiguous()
    return plain.view(w.shape)
