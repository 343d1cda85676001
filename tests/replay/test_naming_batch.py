"""A naming worker names its chunk of jobs in one dry run (`NamingBatch`): every job's result is
the one it gets in a dry run of its own, a job that raises leaves the next one unharmed, and the
batch's dry run is closed before capture_misses opens one."""

from __future__ import annotations

import importlib
import random

import pytest

import aiter.aot.flydsl.dry_run as dry_run_module
from aiter import dispatch
from aiter.aot.flydsl.jobs.family import Job
from aiter.aot.flydsl.jobs.records import JobInfo, Tag
from aiter.aot.flydsl.replay.naming import NamingBatch, name_job

ARCH = "gfx942"
JOBS_PER_MODULE = 12


def _summary(result) -> tuple:
    segments = [
        (s.lo, s.hi, [k.path for k in s.kernels], list(s.backends)) for s in result.segments
    ]
    return result.tag, result.message, result.probes, segments


def _jobs(module: str) -> list[Job]:
    family = importlib.import_module(f"aiter.aot.flydsl.{module}").FAMILY
    jobs = family.jobs(ARCH, None, family.axes())
    return random.Random(module).sample(jobs, min(JOBS_PER_MODULE, len(jobs)))


@pytest.mark.parametrize("module", ["gemm", "moe", "conv3d", "fmha_fp8", "chunk_gdn_h"])
def test_a_batch_names_each_job_as_its_own_dry_run_does(module, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path))
    jobs = _jobs(module)
    alone = [_summary(name_job(job, None)) for job in jobs]
    entered = []
    real_dry_run = dry_run_module.dry_run

    def counted(*args):
        entered.append(args)
        return real_dry_run(*args)

    monkeypatch.setattr(dry_run_module, "dry_run", counted)
    with NamingBatch() as batch:
        batched = [_summary(name_job(job, None, batch=batch)) for job in jobs]
    assert batched == alone
    assert len(entered) == len({(job.info.arch, job.info.cu_num) for job in jobs}) == 1
    assert any(tag == Tag.OK for tag, *_ in alone)


def _failing_job() -> Job:
    def call(tokens: int) -> None:
        import torch

        torch.empty((4,), device="cuda")
        raise RuntimeError("the entry refused the call")

    info = JobInfo("broken", "broken.csv", "broken.csv:2", ARCH, 304, "", "tokens", 1, 8)
    return Job(info, call)


def test_a_job_that_raises_closes_the_batch_and_the_next_job_is_named_right(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path))
    good = _jobs("fmha_fp8")[:2]
    expected = [_summary(name_job(job, None)) for job in good]
    with NamingBatch() as batch:
        first = _summary(name_job(good[0], None, batch=batch))
        failed = name_job(_failing_job(), None, batch=batch)
        assert batch.requests == [] and batch.records == []  # closed after the failure
        second = _summary(name_job(good[1], None, batch=batch))
    assert failed.tag == Tag.FAIL and "refused the call" in failed.message
    assert [first, second] == expected


def test_closing_the_batch_leaves_no_dry_run_behind(tmp_path, monkeypatch) -> None:
    import torch

    from aiter import device

    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path))
    observers = list(dispatch._observers)
    with NamingBatch() as batch:
        name_job(_jobs("gemm")[0], None, batch=batch)
        assert device._simulated is not None  # still open between jobs
        assert len(dispatch._observers) == len(observers) + 1
    assert device._simulated is None and dispatch._observers == observers
    assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
    assert not torch.empty((2,)).is_meta  # a real CPU tensor: the fake mode is gone
