"""The inputs of a job's call that do not follow its axis (weights, their scales, biases, expert
masks): made once and passed again at every probe, as a serving caller keeps its weights from
call to call, so that a probe makes only the tensors the axis sizes."""

from __future__ import annotations

from typing import Any


class FixedInputs:
    """One call's fixed tensors, by argument name, shape and dtype, kept for the fake mode they
    were made in; outside a fake mode every call gets new tensors."""

    def __init__(self) -> None:
        self._mode: Any = None
        self._made: dict[tuple, Any] = {}

    def empty(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
        if mode is None:
            return torch.empty(shape, dtype=dtype, device="cuda")
        if mode is not self._mode:
            self._mode, self._made = mode, {}
        key = (name, tuple(shape), dtype)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = torch.empty(shape, dtype=dtype, device="cuda")
        return made
