"""chunk_gdn_h's host side: the grid-fill rule for BV and its switch points, and the argument
checks (inside a dry run, so tensors are FakeTensors on a GPU stand-in): the sizes a valid call
yields, and an error naming the argument for each kind of bad input.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.chunk_gdn_h import plan
from aiter.ops.chunk_gdn_h.arguments import ChunkHCall, check_call
from aiter.ops.chunk_gdn_h.kernels.chunk_h_index import grid_size
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H

BF16 = torch.bfloat16


def test_the_rule_by_hand():
    # Qwen3-Next at TP1: 32 value heads, V = 128, 304 CUs.
    assert grid_size(1, 32, 128, 64) == 64
    assert plan.grid_fill_block_v(1, 32, 128, 304) == 16  # 256 work-groups even at 16: narrowest
    assert plan.grid_fill_block_v(3, 32, 128, 304) == 32  # 3 * 32 * 4 = 384 >= 304
    assert plan.grid_fill_block_v(5, 32, 128, 304) == 64  # 5 * 32 * 2 = 320 >= 304
    assert plan.block_v_switch_points(32, 128, 304) == [3, 5]
    # Only widths dividing V.
    assert plan.legal_block_vs(16) == (16,) and plan.legal_block_vs(48) == (16,)
    assert plan.legal_block_vs(96) == (16, 32)
    assert plan.grid_fill_block_v(100, 32, 16, 80) == 16


@pytest.mark.parametrize("heads, head_dim_v, cu_num", [(32, 128, 304), (8, 128, 80), (4, 48, 256),
                                                       (64, 256, 256), (1, 64, 1)])  # fmt: skip
def test_the_switch_points_are_where_the_rule_changes(heads, head_dim_v, cu_num):
    choices = [plan.grid_fill_block_v(n, heads, head_dim_v, cu_num) for n in range(1, 400)]
    changes = [n for n in range(2, 400) if choices[n - 1] != choices[n - 2]]
    assert changes == [p for p in plan.block_v_switch_points(heads, head_dim_v, cu_num) if p < 400]
    assert choices == sorted(choices)  # more sequences never narrow the tile


def _t(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="cuda")


def _call(**over):
    b, t, hg, h, k, v = over.pop("dims", (2, 100, 2, 4, 128, 64))
    args = dict(
        k=_t(b, t, hg, k), w=_t(b, t, h, k), u=_t(b, t, h, v), g=None, gk=None,
        initial_state=None, output_final_state=False, chunk_size=64, save_new_value=True,
        cu_seqlens=None,
    )  # fmt: skip
    args.update(over)
    return check_call(**args)


def test_a_dense_call_and_a_varlen_call():
    cu = torch.tensor([0, 64, 64, 130, 200], dtype=torch.int64)  # on the host: no sync
    with dry_run("gfx942", 304, bridge.MODE_NAME):
        call = _call(g=_t(2, 100, 4, dtype=torch.float32), output_final_state=True)
        assert (call.batch, call.num_seqs, call.num_chunk_rows, call.heads, call.key_heads) == (
            2, 2, 2, 4, 2,
        )  # fmt: skip
        assert call.use_g and not call.use_gk and call.store_final_state and not call.varlen
        call = _call(
            dims=(1, 200, 2, 4, 128, 64), cu_seqlens=cu, initial_state=_t(4, 4, 128, 64,
                                                                          dtype=torch.float32),
        )  # fmt: skip
        assert call.num_seqs == 4 and call.chunk_offsets == (0, 1, 1, 3, 5)
        assert call.num_chunk_rows == 5 and call.use_h0


BAD = [
    (TypeError, r"^k must be a torch.Tensor", dict(k=[1, 2])),
    (ValueError, r"^k must be \[B, T, Hg, K\], got 3 dims", dict(k="3d")),
    (ValueError, r"^k must be bfloat16 or float16, got torch.float32", dict(k="fp32")),
    (ValueError, r"^w must have shape \[B, T, H, K\] = \[2, 100, 4, 128\]", dict(w="short")),
    (ValueError, r"^u must have k's dtype", dict(u="fp16")),
    (ValueError, r"^u's heads H = 3 must be a multiple of k's heads Hg = 2", dict(dims=(2, 100, 2, 3, 128, 64))),
    (NotImplementedError, r"^k: head dim K must be one of", dict(dims=(2, 100, 2, 4, 96, 64))),
    (NotImplementedError, r"^u: head dim V must be a multiple of 16", dict(dims=(2, 100, 2, 4, 128, 40))),
    (NotImplementedError, r"^chunk_size must be one of \(64,\), got 32", dict(chunk_size=32)),
    (TypeError, r"^output_final_state must be True or False, got 1", dict(output_final_state=1)),
    (ValueError, r"^g must have shape \[B, T, H\] = \[2, 100, 4\]", dict(g="4d")),
    (ValueError, r"^gk must be float32, bfloat16 or float16, got torch.int32", dict(gk="int")),
    (ValueError, r"^initial_state must have shape \[N, H, K, V\] = \[2, 4, 128, 64\]", dict(initial_state="short")),
    (ValueError, r"^initial_state must be float32, got torch.bfloat16", dict(initial_state="bf16")),
    (ValueError, r"^k: a varlen batch \(cu_seqlens\) must have B = 1, got B = 2", dict(cu_seqlens="ok")),
    (ValueError, r"^cu_seqlens must run from 0 to the 100 tokens of k, got 0 to 90", dict(dims=(1, 100, 2, 4, 128, 64), cu_seqlens="short")),
    (ValueError, r"^cu_seqlens must not decrease: entry 2 is 40, after 60", dict(dims=(1, 100, 2, 4, 128, 64), cu_seqlens="down")),
    (ValueError, r"^cu_seqlens must be an int32 or int64 tensor \[N \+ 1\]", dict(dims=(1, 100, 2, 4, 128, 64), cu_seqlens="float")),
    (ValueError, r"^k must be on a GPU device, got cpu", dict(k="cpu")),
    (ValueError, r"^w must be contiguous", dict(w="strided")),
    (ValueError, r"^cu_seqlens: its values decide h's chunk count", dict(dims=(1, 100, 2, 4, 128, 64), cu_seqlens="fake")),
]  # fmt: skip


def _make(name: str, kind: str):
    """The bad value `kind` of argument `name`, built inside the dry run."""
    b, t, hg, h, k, v = 2, 100, 2, 4, 128, 64
    return {
        "3d": lambda: _t(b, t, k),
        "fp32": lambda: _t(b, t, hg, k, dtype=torch.float32),
        "short": lambda: {
            "w": _t(b, t, h, 64),
            "initial_state": _t(2, 4, 128, 32, dtype=torch.float32),
        }[name],
        "fp16": lambda: _t(b, t, h, v, dtype=torch.float16),
        "4d": lambda: _t(b, t, h, 1, dtype=torch.float32),
        "int": lambda: _t(b, t, h, k, dtype=torch.int32),
        "bf16": lambda: _t(2, 4, 128, 64),
        "cpu": lambda: torch.zeros(b, t, hg, k, dtype=BF16, device="cpu"),
        "strided": lambda: _t(b, t, h, 2 * k)[:, :, :, ::2],
    }[kind]()


@pytest.mark.parametrize("exc, match, over", BAD, ids=[f"{i}-{m[1:].split()[0]}" for i, (_, m, _) in enumerate(BAD)])  # fmt: skip
def test_bad_input_names_its_argument(exc, match, over):
    # Host tensors made outside the dry run: the entry reads their values.
    seqlens = {
        "short": torch.tensor([0, 50, 90], dtype=torch.int32),
        "down": torch.tensor([0, 60, 40, 100], dtype=torch.int64),
        "float": torch.zeros(3),
        "ok": torch.tensor([0, 100], dtype=torch.int32),
    }
    with dry_run("gfx942", 304, bridge.MODE_NAME), pytest.raises(exc, match=match):
        resolved = {}
        for name, value in over.items():
            if name == "cu_seqlens":
                fake = _t(2, dtype=torch.int32)
                resolved[name] = fake if value == "fake" else seqlens[value]
            elif isinstance(value, str) and name != "dims":
                resolved[name] = _make(name, value)
            else:
                resolved[name] = value
        _call(**resolved)


def test_every_bv_choice_is_legal_for_every_call_shape():
    for n, heads, v, cu in itertools.product([1, 2, 7, 64], [1, 8, 32], [16, 48, 128, 256],
                                             [1, 80, 304]):  # fmt: skip
        block_v = plan.grid_fill_block_v(n, heads, v, cu)
        assert block_v in plan.BLOCK_VS and v % block_v == 0


# --- the tuned table and the plan's lookup ---


def test_the_default_table_names_the_rules_choice_for_every_row():
    table = CHUNK_GDN_H.load()
    assert len(table.rows) == 144
    for row in table.rows:
        assert row["us"] == ""  # nothing here was measured on a GPU
        want = plan.grid_fill_block_v(row.int("N"), row.int("H"), row.int("V"), row.int("cu_num"))
        assert row.int("BV") == want
    layers = {(r["gfx"], r.int("H"), r.int("Hg"), r.int("K"), r.int("V")) for r in table.rows}
    assert layers == {(gfx, h, hg, 128, 128) for gfx in ("gfx942", "gfx950", "gfx1250")
                      for h, hg in ((32, 16), (8, 4))}  # fmt: skip


def _fake_call(**over) -> ChunkHCall:
    fields = dict(
        batch=1, seqlen=8192, num_seqs=8, heads=32, key_heads=16, head_dim=128, head_dim_v=128,
        chunk_size=64, num_chunk_rows=0, dtype=BF16, use_g=True, use_gk=False, use_h0=True,
        store_final_state=True, save_new_value=True, varlen=True, cu_seqlens=None,
        chunk_offsets=None,
    )  # fmt: skip
    fields.update(over)
    return ChunkHCall(**fields)


def test_a_tabled_call_takes_its_rows_bv_and_others_the_rule(tmp_path, monkeypatch):
    # A tuned row that disagrees with the rule: N = 8 at TP1 on gfx942, 8192 tokens, BV 32.
    row = dict(gfx="gfx942", cu_num="304", dtype="torch.bfloat16", K="128", V="128", BT="64",
               H="32", Hg="16", is_varlen="1", use_g="1", use_gk="0", use_h0="1", store_fs="1",
               save_vn="1", T_flat="8192", N="8", BV="32", us="12.5")  # fmt: skip
    path = tmp_path / "mine.csv"
    path.write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    monkeypatch.setenv(CHUNK_GDN_H.env_var, str(path))
    assert plan.grid_fill_block_v(8, 32, 128, 304) == 64
    for tokens in (1, 5000, 8192):  # the row's bucket: up to its T_flat, from 1
        choice = plan.choose_block_v(_fake_call(seqlen=tokens), "gfx942", 304)
        assert choice.block_v == 32 and choice.row is not None and choice.row.line == 2
    # The default table's next row (32768 tokens) serves above it, with the rule's BV.
    choice = plan.choose_block_v(_fake_call(seqlen=8193), "gfx942", 304)
    assert choice.block_v == 64 and choice.row.int("T_flat") == 32768
    # Untabled: more tokens than any row, another N, another layer, another arch's CU count.
    for call, cu in ((_fake_call(seqlen=40000), 304), (_fake_call(num_seqs=9), 304),
                     (_fake_call(heads=16, key_heads=16), 304), (_fake_call(), 300)):  # fmt: skip
        choice = plan.choose_block_v(call, "gfx942", cu)
        assert choice.row is None
        assert choice.block_v == plan.grid_fill_block_v(call.num_seqs, call.heads, 128, cu)


@pytest.mark.parametrize("cells, column, expected", [
    (dict(BV="48"), "BV", "one of 16, 32, 64"),
    (dict(BV="64", V="32"), "BV", "a V tile width that divides V (32)"),
    (dict(BV="32", V="48"), "BV", "a V tile width that divides V (48)"),
    (dict(H="12", Hg="8"), "H", "a multiple of Hg (8)"),
    (dict(is_varlen="0", T_flat="100", N="3"), "T_flat", "a multiple of N (3)"),
    (dict(K="96"), "K", "one of 64, 128, 192, 256"),
])  # fmt: skip
def test_a_bad_row_is_refused_at_load_naming_file_line_and_column(tmp_path, cells, column,
                                                                   expected):  # fmt: skip
    row = dict(zip(CHUNK_GDN_H.header, next(iter(CHUNK_GDN_H.load().rows)).cells.values(),
                   strict=True))  # fmt: skip
    row.update(cells)
    path = tmp_path / "bad.csv"
    path.write_text(",".join(CHUNK_GDN_H.header) + "\n" + ",".join(row.values()) + "\n")
    with pytest.raises(ValueError) as err:
        CHUNK_GDN_H.load([str(path)])
    message = str(err.value)
    assert f"{path}:2" in message and repr(column) in message and expected in message
