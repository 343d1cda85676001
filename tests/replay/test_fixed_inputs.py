"""A job's fixed inputs (weights, scales, biases, masks) are made once per fake mode and passed
again at every probe; outside a fake mode each call gets new tensors."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from aiter.aot.flydsl.jobs.fixed_inputs import FixedInputs


def test_a_fixed_input_is_the_same_tensor_at_every_call_of_one_mode() -> None:
    fixed = FixedInputs()
    with FakeTensorMode():
        weight = fixed.empty("w1", (8, 16), torch.bfloat16)
        assert fixed.empty("w1", (8, 16), torch.bfloat16) is weight
        assert fixed.empty("w2", (8, 16), torch.bfloat16) is not weight  # another argument
        assert fixed.empty("w1", (8, 32), torch.bfloat16) is not weight  # another shape
        assert fixed.empty("w1", (8, 16), torch.float16) is not weight  # another dtype
        assert weight.device.type == "cuda" and weight.shape == (8, 16)


def test_another_mode_gets_new_tensors_and_no_mode_gets_real_ones() -> None:
    fixed = FixedInputs()
    with FakeTensorMode() as first:
        made_in_first = fixed.empty("w", (4,), torch.float32)
    with FakeTensorMode() as second:
        made_in_second = fixed.empty("w", (4,), torch.float32)
    assert made_in_first.fake_mode is first and made_in_second.fake_mode is second
    try:
        real = fixed.empty("w", (4,), torch.float32)
    except (RuntimeError, AssertionError) as err:  # no GPU here: a real cuda tensor cannot exist
        assert "cuda" in str(err).lower() or "nvidia" in str(err).lower()
    else:
        assert not hasattr(real, "fake_mode")
