"""Static profile of the MoE sorting kernels: what each compiled kernel holds (FlyDSL's ISA
listing, on CPU) and how the work per lane grows with the token count.

    .venv/bin/python benchmarks/sorting_profile.py [--arch gfx942,gfx950,gfx1250] [--json PATH]

Per kernel and arch: VGPRs, LDS bytes, waves per SIMD, loops, global loads and waits in the
whole kernel and in its loops (a loop that loads once per pass and waits on it is the serial
pattern the counting sort removes), barriers and atomics. Then, from sorting_index alone, per
token count (topk 8, 256 experts, block 32): blocks per launch, the routed entries one lane
ranks, the scan thread's passes, and the serial round trips a lane makes (loads it must wait
for one after another). Nothing runs on a GPU: every figure is static.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from aiter.flydsl_bridge import listing as isa  # noqa: E402
from aiter.ops.moe.kernels import sorting_index as ix  # noqa: E402

KERNELS = ("moe_sorting_count", "moe_sorting_scan", "moe_sorting_scatter")
TOKENS = (1, 64, 1024, 8192, 32768, 65536)
TOPK, EXPERTS, BLOCK = 8, 256, 32

_CHILD = """
import torch
from aiter.ops.moe.kernels.sorting import launch_moe_sorting, sorting_workspace_size
from aiter.ops.moe.kernels.sorting_index import sorting_sizes

m, topk, e, b = 300, 8, 64, 32
p, nb = sorting_sizes(m, topk, e, b)
i32 = dict(dtype=torch.int32)
launch_moe_sorting(
    torch.empty(m, topk, **i32), torch.empty(m, topk), torch.empty(p, **i32), torch.empty(p),
    torch.empty(nb, **i32), torch.empty(2, **i32),
    torch.empty(sorting_workspace_size(m, topk, e), **i32),
    num_experts=e, block_size=b, expert_mask=torch.empty(e, **i32),
    num_local_tokens=torch.empty(1, **i32),
)
"""


def kernel_facts(text: str) -> dict:
    """What one sorting kernel's listing holds."""
    lst = isa.parse_listing(text)
    mnemonics = [inst.mnemonic for inst in lst.instructions]
    loops = []
    for lp in isa.loops(lst):
        body = [inst.mnemonic for inst in lp.body]
        loops.append(
            dict(
                loads=sum(isa.vmem_kind(op) == "load" for op in body),
                waits=sum(op.startswith(("s_waitcnt", "s_wait_loadcnt")) for op in body),
                instructions=len(body),
            )
        )
    waves = lst.waves_per_block or 1
    return dict(
        vgprs=lst.vgprs,
        lds_bytes=lst.lds_bytes,
        occupancy=isa.occupancy(lst.arch, lst.arch_vgprs, lst.agprs, lst.lds_bytes, waves),
        instructions=len(mnemonics),
        loads=sum(isa.vmem_kind(op) == "load" for op in mnemonics),
        stores=sum(isa.vmem_kind(op) == "store" for op in mnemonics),
        atomics=sum("atomic" in op for op in mnemonics),
        barriers=sum(op.startswith("s_barrier") for op in mnemonics),
        lds_ops=sum(op.startswith("ds_") for op in mnemonics),
        loops=loops,
    )


def profile_arch(arch: str) -> dict[str, dict]:
    from compile_env import child_env

    with tempfile.TemporaryDirectory(prefix="sorting_profile_") as tmp:
        root = Path(tmp)
        env = child_env(arch, root / "cache")
        env.update(FLYDSL_DEBUG_DUMP_ASM="1", FLYDSL_DUMP_DIR=str(root / "dump"))
        child = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, cwd=REPO, capture_output=True, text=True
        )
        if child.returncode != 0:
            raise SystemExit(f"{arch}: compile failed\n{child.stderr[-3000:]}")
        facts = {}
        for kernel in KERNELS:
            (path,) = sorted((root / "dump").glob(f"{kernel}_kernel_*/*final_isa.s"))
            facts[kernel] = kernel_facts(path.read_text())
        return facts


def work_per_lane(tokens: int, wave_size: int = 64) -> dict:
    """The counting sort's work per lane at a token count, from the index functions; beside
    it the serial design's (a thread per expert walks every entry; one thread scans)."""
    entries = tokens * TOPK
    chunks = ix.num_chunks(tokens, TOPK)
    p, _ = ix.sorting_sizes(tokens, TOPK, EXPERTS, BLOCK)
    used_blocks_bound = -(-p // BLOCK)
    scan_passes = -(-chunks // ix.SCAN_BATCH)
    return dict(
        tokens=tokens,
        entries=entries,
        blocks_per_launch=chunks,
        entries_per_lane=min(ix.ROUNDS, -(-entries // wave_size)),
        scan_batches=scan_passes,
        scan_block_passes=-(-used_blocks_bound // ix.SCAN_THREADS),
        # Round trips a lane waits for one after another: count/scatter load a lane's ROUNDS
        # entries together (one wait each, the scatter also its weights and slots); the scan
        # waits once per batch of chunk counts.
        serial_waits=1 + 3 + scan_passes,
        serial_design_waits=2 * entries + EXPERTS,
    )


def format_tables(facts: dict[str, dict[str, dict]], work: list[dict]) -> str:
    lines = [
        "Static figures from FlyDSL's ISA listings (nothing ran on a GPU).",
        f"{'kernel':22} {'arch':8} {'VGPR':>5} {'LDS B':>6} {'w/SIMD':>6} {'instr':>6}"
        f" {'loads':>5} {'stores':>6} {'atomics':>7} {'barriers':>8}  loops (loads/s_waitcnt per pass)",
    ]
    for arch, kernels in facts.items():
        for kernel, f in kernels.items():
            loops = ", ".join(f"{lp['loads']}/{lp['waits']}" for lp in f["loops"]) or "none"
            lines.append(
                f"{kernel:22} {arch:8} {f['vgprs']:>5} {f['lds_bytes']:>6}"
                f" {str(f['occupancy'] or '-'):>6}"
                f" {f['instructions']:>6} {f['loads']:>5} {f['stores']:>6} {f['atomics']:>7}"
                f" {f['barriers']:>8}  {loops}"
            )
    lines += [
        "",
        f"Work per lane (topk {TOPK}, {EXPERTS} experts, block {BLOCK}, wave64):",
        f"{'tokens':>7} {'entries':>8} {'blocks':>7} {'entries/lane':>12} {'scan batches':>12}"
        f" {'serial waits':>12} {'serial design':>13}",
    ]
    for w in work:
        lines.append(
            f"{w['tokens']:>7} {w['entries']:>8} {w['blocks_per_launch']:>7}"
            f" {w['entries_per_lane']:>12} {w['scan_batches']:>12} {w['serial_waits']:>12}"
            f" {w['serial_design_waits']:>13}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="gfx942,gfx950,gfx1250")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    facts = {arch: profile_arch(arch) for arch in args.arch.split(",")}
    work = [work_per_lane(t) for t in TOKENS]
    print(format_tables(facts, work))
    if args.json:
        args.json.write_text(json.dumps(dict(kernels=facts, work=work), indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
