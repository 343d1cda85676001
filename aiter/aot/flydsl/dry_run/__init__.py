"""The dry run: a CPU-only process that looks like one GPU of a target arch (`dry_run`), with the
FakeTensorMode it runs operators in (`fake_mode`, `size_free`).
"""

from aiter.aot.flydsl.dry_run.context import (
    GUARDED_TORCH_CUDA,
    GpuRuntimeReached,
    SimulatedStream,
    dry_run,
    host_tensor,
)

__all__ = ["GUARDED_TORCH_CUDA", "GpuRuntimeReached", "SimulatedStream", "dry_run", "host_tensor"]
