// The fused-MoE host planner: the integer arithmetic that picks a tuned-table bucket, sizes the
// token sorting and chooses the untuned block size and stage-1 K split. This file is the one
// implementation; aiter/ops/moe_host.py only calls it.
//
// Every op takes and returns integers only (no tensors). They are registered with a catch-all
// kernel (`m.def(schema, fn)`, i.e. CompositeImplicitAutograd), which is what an op without
// tensor arguments needs:
//   - outside any mode the dispatch key set is empty and the dispatcher sends it to the
//     CompositeImplicitAutograd kernel (a backend kernel such as `m.impl(name, kCPU, fn)`
//     would never be reached: no tensor argument names a backend);
//   - under FakeTensorMode (the AOT dry run) the Python key routes the call to the mode, which
//     decomposes a CompositeImplicitAutograd op by running this kernel, so the ops return real
//     Python ints there too: they read sizes, never data, and need no fake.
// Every op checks its arguments and fails with "<op>: <argument> must ..., got <value>".

#include <Python.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <vector>

namespace aiter {
namespace {

// Token counts below this pad to a power of two; at or above it they fall to a tier.
constexpr int64_t kFirstTier = 32768;
// The tiers at or above kFirstTier, largest first: get_padded_M's values >= 32768.
constexpr std::array<int64_t, 3> kTiers = {131072, 65536, 32768};
// Stage-1 output columns per work-group: the intermediate dim is tiled 64 wide.
constexpr int64_t kInterTile = 64;
// The smallest untuned block size; block_m only halves down to it.
constexpr int64_t kMinBlockM = 16;
// Stage-1 K splits: each slice of K = model_dim is a multiple of this and at least kMinKSlice.
constexpr int64_t kKSplitAlign = 256;
constexpr int64_t kMinKSlice = 1024;

void check_positive(const char* op, const char* name, int64_t value) {
  TORCH_CHECK(value >= 1, op, ": ", name, " must be >= 1, got ", value);
}

void check_topk(const char* op, int64_t topk, int64_t num_experts) {
  check_positive(op, "topk", topk);
  check_positive(op, "num_experts", num_experts);
  TORCH_CHECK(topk <= num_experts, op, ": topk must be <= num_experts (", num_experts, "), got ",
              topk);
}

// a * b, failing with a message naming the product when it does not fit in int64.
int64_t mul(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t out = 0;
  TORCH_CHECK(!__builtin_mul_overflow(a, b, &out), op, ": ", what, " overflows int64 (", a,
              " * ", b, ")");
  return out;
}

int64_t add(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t out = 0;
  TORCH_CHECK(!__builtin_add_overflow(a, b, &out), op, ": ", what, " overflows int64 (", a,
              " + ", b, ")");
  return out;
}

// ceil(a / b) for a >= 0 and b >= 1, without forming a + b - 1.
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// The token count a tuned-table lookup uses. tokens >= 1.
//   tokens < 32768:            the smallest power of two >= tokens (1->1, 3->4, 16385->32768)
//   32768 <= tokens < 65536:   32768
//   65536 <= tokens < 131072:  65536
//   tokens >= 131072:          131072
int64_t get_padded_M(int64_t tokens) {
  check_positive("get_padded_M", "tokens", tokens);
  if (tokens < kFirstTier) {
    int64_t padded = 1;
    while (padded < tokens) padded *= 2;
    return padded;
  }
  if (tokens >= kTiers[0]) return kTiers[0];
  if (tokens >= kTiers[1]) return kTiers[1];
  return kTiers[2];
}

// The lookup order for a padded count: [padded], then the smaller tiers at or above 32768 in
// decreasing order. 131072 -> [131072, 65536, 32768]; 65536 -> [65536, 32768];
// padded <= 32768 -> [padded]. padded is a value get_padded_M returns: a power of two in
// [1, 131072].
std::vector<int64_t> moe_padded_tiers(int64_t padded) {
  TORCH_CHECK(padded >= 1 && padded <= kTiers.front() && (padded & (padded - 1)) == 0,
              "moe_padded_tiers: padded must be a value get_padded_M returns (a power of two in "
              "[1, ",
              kTiers.front(), "]), got ", padded);
  std::vector<int64_t> tiers{padded};
  for (int64_t tier : kTiers) {
    if (tier < padded) tiers.push_back(tier);
  }
  return tiers;
}

// [P, num_blocks] of the token sorting:
//   P = tokens * topk + num_experts * block_size - topk   (sorted slots: every routed row plus
//       each expert's last block padded full; an upper bound for any routing)
//   num_blocks = ceil(P / block_size)
// All arguments >= 1; topk <= num_experts.
std::vector<int64_t> moe_sorting_sizes(int64_t tokens, int64_t topk, int64_t num_experts,
                                       int64_t block_size) {
  constexpr const char* op = "moe_sorting_sizes";
  check_positive(op, "tokens", tokens);
  check_topk(op, topk, num_experts);
  check_positive(op, "block_size", block_size);
  const int64_t rows = mul(op, "tokens * topk", tokens, topk);
  const int64_t padding = mul(op, "num_experts * block_size", num_experts, block_size);
  const int64_t slots = add(op, "tokens * topk + num_experts * block_size", rows, padding) - topk;
  return {slots, ceil_div(slots, block_size)};
}

// The untuned block size (rows of sorted tokens per block = tile_m of both stage kernels):
//   r = ceil(tokens * topk / num_experts)            (routed rows per expert on average)
//   block_m = 16 if r <= 16, 32 if r <= 64, else 64
//   while block_m > 16 and blocks(block_m) < cu_num: block_m /= 2
//   blocks(b) = num_experts * ceil(r / b) * ceil(inter_dim / 64)   (stage-1 work-groups)
// All arguments >= 1; topk <= num_experts.
int64_t moe_block_m(int64_t tokens, int64_t topk, int64_t num_experts, int64_t inter_dim,
                    int64_t cu_num) {
  constexpr const char* op = "moe_block_m";
  check_positive(op, "tokens", tokens);
  check_topk(op, topk, num_experts);
  check_positive(op, "inter_dim", inter_dim);
  check_positive(op, "cu_num", cu_num);
  const int64_t r = ceil_div(mul(op, "tokens * topk", tokens, topk), num_experts);
  const int64_t col_tiles = ceil_div(inter_dim, kInterTile);
  const auto blocks = [&](int64_t block_m) {
    const int64_t expert_blocks = mul(op, "stage-1 blocks", num_experts, ceil_div(r, block_m));
    return mul(op, "stage-1 blocks", expert_blocks, col_tiles);
  };
  int64_t block_m = r <= 16 ? 16 : r <= 64 ? 32 : 64;
  while (block_m > kMinBlockM && blocks(block_m) < cu_num) block_m /= 2;
  return block_m;
}

// The untuned K split of stage 1 (K = model_dim):
//   blocks = ceil(tokens * topk / block_m) * ceil(inter_dim / 64)   (an upper estimate of the
//            stage-1 work-groups that have rows)
//   ksplit = the largest s in {1, 2, 4} with blocks * s <= cu_num and model_dim % (s * 256) == 0
//            and model_dim / s >= 1024; 1 if none
// All arguments >= 1; topk <= num_experts.
int64_t moe_ksplit(int64_t tokens, int64_t topk, int64_t num_experts, int64_t model_dim,
                   int64_t inter_dim, int64_t block_m, int64_t cu_num) {
  constexpr const char* op = "moe_ksplit";
  check_positive(op, "tokens", tokens);
  check_topk(op, topk, num_experts);
  check_positive(op, "model_dim", model_dim);
  check_positive(op, "inter_dim", inter_dim);
  check_positive(op, "block_m", block_m);
  check_positive(op, "cu_num", cu_num);
  const int64_t row_blocks = ceil_div(mul(op, "tokens * topk", tokens, topk), block_m);
  const int64_t blocks = mul(op, "stage-1 blocks", row_blocks, ceil_div(inter_dim, kInterTile));
  for (int64_t split : {4, 2}) {
    const bool fits = blocks <= cu_num / split;  // blocks * split <= cu_num, without overflow
    if (fits && model_dim % (split * kKSplitAlign) == 0 && model_dim / split >= kMinKSlice) {
      return split;
    }
  }
  return 1;
}

}  // namespace
}  // namespace aiter

// One TORCH_LIBRARY block may define the `aiter` namespace per process; another extension adds
// its ops with TORCH_LIBRARY_FRAGMENT(aiter, m).
TORCH_LIBRARY(aiter, m) {
  m.def("get_padded_M(int tokens) -> int", &aiter::get_padded_M);
  m.def("moe_padded_tiers(int padded) -> int[]", &aiter::moe_padded_tiers);
  m.def("moe_sorting_sizes(int tokens, int topk, int num_experts, int block_size) -> int[]",
        &aiter::moe_sorting_sizes);
  m.def("moe_block_m(int tokens, int topk, int num_experts, int inter_dim, int cu_num) -> int",
        &aiter::moe_block_m);
  m.def(
      "moe_ksplit(int tokens, int topk, int num_experts, int model_dim, int inter_dim, "
      "int block_m, int cu_num) -> int",
      &aiter::moe_ksplit);
}

// Importing the module (aiter._moe_host) runs the registration above; it has no attributes.
#define AITER_CONCAT_(a, b) a##b
#define AITER_CONCAT(a, b) AITER_CONCAT_(a, b)
#define AITER_STRING_(x) #x
#define AITER_STRING(x) AITER_STRING_(x)

static PyModuleDef aiter_moe_host_module = {
    PyModuleDef_HEAD_INIT,
    AITER_STRING(TORCH_EXTENSION_NAME),
    "The fused-MoE host planner; importing it registers torch.ops.aiter.*.",
    0,  // no per-module state
    nullptr,
};

PyMODINIT_FUNC AITER_CONCAT(PyInit_, TORCH_EXTENSION_NAME)() {
  return PyModuleDef_Init(&aiter_moe_host_module);
}
