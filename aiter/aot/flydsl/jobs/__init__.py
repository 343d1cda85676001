"""What an AOT module declares and what a build passes around: the Family and its calls, the jobs
made of a table's rows (bisection of their axis ranges, shards), and the typed records.

An AOT module needs only the names below.
"""

from aiter.aot.flydsl.jobs.axes import (
    Along,
    CaptureError,
    along_dims,
    dims_along,
    tensor,
    with_host_values,
    with_sizes,
)
from aiter.aot.flydsl.jobs.family import Call, CapturedOp, Family, Job
from aiter.aot.flydsl.jobs.fixed_inputs import FixedInputs

__all__ = [
    "Along",
    "Call",
    "CaptureError",
    "CapturedOp",
    "Family",
    "FixedInputs",
    "Job",
    "along_dims",
    "dims_along",
    "tensor",
    "with_host_values",
    "with_sizes",
]
