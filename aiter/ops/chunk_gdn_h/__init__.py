"""The chunked gated delta rule's hidden-state pass (chunk_gdn_h), the prefill half of Gated
DeltaNet and KDA layers: argument checks (arguments.py), the V-tile plan (plan.py) and the
kernel's index arithmetic (kernels/chunk_h_index.py). The FlyDSL kernel, its table and the
public entry `chunk_gated_delta_rule_fwd_h` build on these."""
