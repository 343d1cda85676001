"""Naming a job: where a family says its choice may flip back and forth along the axis, every
value of a short range is probed, so a kernel used at isolated values is found; bisection alone
misses it (it takes the kernels as constant between equal samples)."""

from __future__ import annotations

from aiter.aot.flydsl.jobs.family import Job
from aiter.aot.flydsl.jobs.records import JobInfo
from aiter.aot.flydsl.replay.naming import name_job

FLIP_EVERY = 5  # the runtime's choice: block 128 at every fifth token count, 64 elsewhere


def _flipping_job(probe_every_up_to: int) -> Job:
    def call(tokens: int) -> None:
        import torch

        from tests.fixtures.tiny_kernels import scale

        x = torch.empty((256,), dtype=torch.float32, device="cuda")
        scale(x, torch.empty_like(x), 256, 128 if tokens % FLIP_EVERY == 0 else 64)

    info = JobInfo("flip", "flip.csv", "flip.csv:2", "gfx942", 304, "", "tokens", 1, 40)
    return Job(info, call, probe_every_up_to)


def test_dense_probing_finds_every_flip_that_bisection_misses(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path))
    dense = name_job(_flipping_job(probe_every_up_to=40), None)
    assert dense.tag == "OK", dense.message
    assert dense.probes == 40
    isolated = [(s.lo, s.hi) for s in dense.segments if "block=128" in s.kernels[0].params]
    assert isolated == [(v, v) for v in range(FLIP_EVERY, 41, FLIP_EVERY)]
    assert len(dense.segments) == 16

    bisected = name_job(_flipping_job(probe_every_up_to=0), None)
    found = [(s.lo, s.hi) for s in bisected.segments if "block=128" in s.kernels[0].params]
    assert len(found) < len(isolated)  # the flips between equal samples stay unseen


def test_a_range_longer_than_the_limit_is_bisected(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path))
    result = name_job(_flipping_job(probe_every_up_to=39), None)
    assert result.probes < 40
