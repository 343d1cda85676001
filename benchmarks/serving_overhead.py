"""Measures what the serving-side settings cost a call's host path: the defaults, the JIT monitor
(`AITER_JIT=warn`), a serving capture (`AITER_CAPTURE=PATH`: after the first call of a shape, a
key and a dict lookup per call) and the AOT fallback (`AITER_AOT_FALLBACK=1`, with the planned
kernel cached, and with it deleted so that a sibling serves), and a first call against the
number of entries in its kernel's cache directory. Prints ratios from one run;
nothing is asserted.

    .venv/bin/python benchmarks/serving_overhead.py [--calls 300]

A small gfx942 cache (one GEMM row with split-K 4 and its no-split sibling) is built first. Each
setting runs in a process of its own (settings are read once per process), under the dry run that
makes the process look like a gfx942 GPU, serving from the cache with FLYDSL_RUNTIME_RUN_ONLY=1:
the time is the host path (lookup, checks, FlyDSL's cache lookup, the launch stub), not a GPU's.
The first call of a shape pays for the JIT monitor's install and, with the fallback, for naming
the variants' kernels; later calls should cost what the defaults cost. Across processes the
ratios carry a few percent of noise; the capture's own cost is also measured inside its process,
alternating blocks of captured and unwrapped calls (goal: under 2% of the call).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from aiter.flydsl_bridge import manifest  # noqa: E402
from aiter.ops.gemm.table import (  # noqa: E402
    A8W8_BLOCKSCALE,
    A8W8_BLOCKSCALE_BPRESHUFFLE,
    A8W8_BPRESHUFFLE,
    A16W16,
)

BF16 = "torch.bfloat16"
STARTUP_ENTRIES = (10, 100, 1000)
ROWS = [  # one tile: split-K 4 serves M 1-32, no split M 33-64
    f"gfx942,304,32,4096,4096,0,{BF16},{BF16},flydsl,4,,flydsl_a16w16_mfma_32x64x64",
    f"gfx942,304,64,4096,4096,0,{BF16},{BF16},flydsl,1,,flydsl_a16w16_mfma_32x64x64",
]

CALLS = textwrap.dedent("""
    import json, sys, time, torch
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run
    from aiter.ops.gemm.entry import gemm_a16w16
    if sys.argv[2:] == ["eager"]:  # FlyDSL's own first use: every entry of the kernel read
        import aiter.ops.shared.kernel_tensors
        from aiter.flydsl_bridge import startup
        startup.restore()
    with dry_run("gfx942", 304, bridge.MODE_COMPILE):
        a = torch.empty((32, 4096), dtype=torch.bfloat16, device="cuda")
        b = torch.empty((4096, 4096), dtype=torch.bfloat16, device="cuda")
        start = time.perf_counter()
        gemm_a16w16(a, b)
        first = time.perf_counter() - start
        calls = int(sys.argv[1])
        start = time.perf_counter()
        for _ in range(calls):
            gemm_a16w16(a, b)
        later = (time.perf_counter() - start) / calls
        result = {"first": first, "later": later}
        plain = getattr(gemm_a16w16, "__wrapped__", None)
        if plain is not None:  # the capture's own cost: pairs of blocks, alternated
            import statistics
            from aiter import capture

            def block(fn, count=20):
                start = time.perf_counter()
                for _ in range(count):
                    fn(a, b)
                return (time.perf_counter() - start) / count

            pairs = [(block(gemm_a16w16), block(plain)) for _ in range(max(5, calls // 20))]
            result["capture_cost"] = statistics.median(c - p for c, p in pairs)
            result["plain"] = statistics.median(p for _, p in pairs)
            start = time.perf_counter()  # what the wrapper adds, alone: key and dedupe lookup
            for _ in range(calls):
                capture._key_part((a, b), torch), capture._key_part((), torch)
            result["key"] = (time.perf_counter() - start) / calls
    print("RESULT " + json.dumps(result))
    """)


def build_cache(work: Path) -> tuple[Path, dict[str, str]]:
    tables = work / "tables"
    tables.mkdir()
    (tables / A16W16.name).write_text("\n".join([",".join(A16W16.header), *ROWS]) + "\n")
    for spec in (A8W8_BPRESHUFFLE, A8W8_BLOCKSCALE, A8W8_BLOCKSCALE_BPRESHUFFLE):
        (tables / spec.name).write_text(",".join(spec.header) + "\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "AITER_CONFIG_DIR": str(tables)}
    env["GPU_ARCHS"] = "gfx942"
    cache = work / "cache"
    command = [sys.executable, "-m", "aiter.aot.flydsl", "--module", "gemm", "--max-m", "64"]
    proc = subprocess.run(
        [*command, "--cache-dir", str(cache), "-j", "2"], cwd=REPO, env=env, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"building the cache failed:\n{proc.stdout}\n{proc.stderr}")
    return cache, env


def delete_split4(cache: Path) -> None:
    for rel, entry in manifest.read(cache).archs["gfx942"]["gemm"].items():
        if entry.function == "gemm_a16w16" and "split_k=4 " in entry.params:
            (cache / rel).unlink()


def pad_kernel_directory(cache: Path, entries: int) -> None:
    """Copies of the split-K 4 GEMM's entry beside it until its directory holds `entries`, as a
    cache of many tuned rows does (FlyDSL never asks for the copies)."""
    for rel, entry in manifest.read(cache).archs["gfx942"]["gemm"].items():
        if entry.function == "gemm_a16w16" and "split_k=4 " in entry.params:
            source = cache / rel
    directory = source.parent
    data = source.read_bytes()
    for i in range(entries - len(list(directory.glob("*.pkl")))):
        (directory / f"padding{i:05d}.pkl").write_bytes(data)


def measure(
    script: Path, cache: Path, env: dict[str, str], calls: int, *extra: str, **settings: str
) -> dict:
    full = {
        k: v
        for k, v in env.items()
        if k not in ("AITER_JIT", "AITER_AOT_FALLBACK", "AITER_CAPTURE")
    }
    full |= {"FLYDSL_RUNTIME_CACHE_DIR": str(cache), "FLYDSL_RUNTIME_RUN_ONLY": "1", **settings}
    proc = subprocess.run(
        [sys.executable, str(script), str(calls), *extra], cwd=REPO, env=full, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{settings or 'defaults'} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return json.loads(lines[0][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls timed after the first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aiter-bench-serving-") as tmp:
        work = Path(tmp)
        cache, env = build_cache(work)
        script = work / "calls.py"
        script.write_text(CALLS)
        results = {
            "defaults": measure(script, cache, env, args.calls),
            "AITER_JIT=warn": measure(script, cache, env, args.calls, AITER_JIT="warn"),
            "AITER_CAPTURE": measure(
                script, cache, env, args.calls, AITER_CAPTURE=str(work / "capture.jsonl")
            ),
            "fallback, kernel cached": measure(
                script, cache, env, args.calls, AITER_AOT_FALLBACK="1"
            ),
        }
        startup = {}
        for entries in STARTUP_ENTRIES:
            pad_kernel_directory(cache, entries)
            startup[entries] = [measure(script, cache, env, 10, *mode)["first"]
                                for mode in ((), ("eager",))]  # fmt: skip
        delete_split4(cache)
        results["fallback, sibling serves"] = measure(
            script, cache, env, args.calls, AITER_AOT_FALLBACK="1"
        )
    base = results["defaults"]
    print(f"gemm_a16w16 M=32 N=K=4096 on a dry-run gfx942, {args.calls} calls after the first")
    print(f"{'setting':<26} {'first ms':>9} {'later us':>9} {'later / defaults':>17}")
    for name, r in results.items():
        print(
            f"{name:<26} {1e3 * r['first']:>9.2f} {1e6 * r['later']:>9.1f}"
            f" {r['later'] / base['later']:>16.2f}x"
        )
    print("(the sibling is the no-split kernel: one launch per call, the split-K pair two)")
    print("a process's first call, by the entries in the kernel's cache directory:")
    print(f"{'entries':>8} {'aiter ms':>9} {'FlyDSL load_all ms':>19}")
    for entries, (ours, eager) in startup.items():
        print(f"{entries:>8} {1e3 * ours:>9.1f} {1e3 * eager:>19.1f}")
    captured = results["AITER_CAPTURE"]
    cost, plain, key = captured["capture_cost"], captured["plain"], captured["key"]
    print(
        f"the capture's own cost in its process: {1e6 * key:.1f} us per call to build the key"
        f" ({100 * key / plain:.2f}% of the call's {1e6 * plain:.0f} us host time here); "
        f"median of alternated captured - unwrapped blocks: {1e6 * cost:.1f} us "
        f"({100 * cost / plain:.2f}%). A dry run's host path is longer than a GPU process's."
    )


if __name__ == "__main__":
    main()
