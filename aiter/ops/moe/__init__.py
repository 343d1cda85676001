"""The fused-MoE family: routing (`fused_topk`), sorting into expert blocks (`moe_sorting`) and
the two-stage expert layer (`fused_moe`), planned by the C++ host planner (csrc/)."""
