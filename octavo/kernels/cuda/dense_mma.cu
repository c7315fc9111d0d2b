// Float (bf16 / fp16) GEMM for decode batches (M <= 32): y [M, N] = x [M, K] @ W [N, K]^T
// (+ bias), W in nn.Linear's layout as it is, on the tensor cores' mma.sync with the weights
// as the A operand: y^T [N, M] = W [N, K] @ x^T [K, M]. octavo/kernels/dense_mma.py builds
// it (nvcc, at first use), plans the launch and says why it is shaped this way.
//
// The design of swapab_mma.cu without the dequantization. A warp takes NT tiles of 16 output
// features (weight rows) over a range of K, in steps of 32: lane (g = lane / 4, t = lane % 4)
// loads 16 bytes (8 values) of rows n0 + g and n0 + g + 8 at k + 8t. The sum over K does not
// care which K value the mma calls which, so the two m16n8k16 products of a step (h = 0, 1)
// take physical K 8t + 4h + {0, 1, 2, 3} as their logical columns {2t, 2t+1, 2t+8, 2t+9}:
// a0..a3 = words 2h of row g, 2h of row g + 8, 2h + 1 of row g, 2h + 1 of row g + 8. The
// activations (B operand, batch row mt * 8 + g) are loaded the same way (b0 = word 2h,
// b1 = word 2h + 1): every register the loads fill is an operand register as it stands, no
// shuffles, no shared memory in the loop. The accumulator d[0], d[1] holds feature n0 + g at
// batch rows mt * 8 + 2t, + 1; d[2], d[3] feature n0 + g + 8 at the same rows.
// tests/kernels/test_dense_mma.py emulates this mapping lane by lane on the CPU.

#include "mma_common.cuh"

namespace {

using octavo::word;

template <typename T, int MT, int NT, int STEPS>
__device__ __forceinline__ void dense_mma(
    const T* __restrict__ x, const uint4* __restrict__ w, const T* __restrict__ bias,
    T* __restrict__ out, float* __restrict__ part, int* __restrict__ cnt, int M, int N, int K,
    int stride_x, int k_per_warp) {
  using Ops = octavo::MmaType<T>;
  constexpr int CHUNK = 32 * STEPS;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int tile = blockIdx.x;  // NT * 16 output features
  // This warp's K range: its share of the CTA's split (blockIdx.y).
  const int k_begin = (blockIdx.y * warps + warp) * k_per_warp;
  const int k_end = min(k_begin + k_per_warp, K);
  // Rows n0(j) + g and n0(j) + g + 8 of tile j: step k of row R at R * K + k, 4 uint4 a step.
  const int n0 = tile * NT * 16;
  const uint4* wrow = w + ((size_t)(n0 + g) * K + 8 * t) / 8;
  const size_t row8 = (size_t)K;  // 8 rows further, in uint4 (8 * K values / 8)

  // Software pipeline, one chunk deep: the next chunk's weights and activations are loaded
  // before this chunk's products, so no load's latency (DRAM for the weights, L2 for x) is
  // waited for inside a chunk.
  struct Chunk {
    uint4 a[NT][STEPS], b[NT][STEPS];  // weight rows g and g + 8 of each tile
    uint4 x[MT][STEPS];                // activation row g of each batch tile
  } next;
  auto load_weights = [&](int k) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint4* wa = wrow + (size_t)j * 2 * row8;  // tile j: 16 rows further
#pragma unroll
      for (int i = 0; i < STEPS; ++i) {
        next.a[j][i] = __ldg(wa + (k / 32 + i) * 4);
        next.b[j][i] = __ldg(wa + row8 + (k / 32 + i) * 4);
      }
    }
  };
  auto load_x = [&](int k) { octavo::load_x(next.x, x, M, stride_x, k, g, t); };
  if (k_begin < k_end) load_weights(k_begin);
  octavo::pdl_wait();  // the first weights are on their way while the previous kernel ends
  if (k_begin < k_end) load_x(k_begin);

  float acc[MT][NT][4] = {};
  for (int k = k_begin; k < k_end; k += CHUNK) {
    const Chunk cur = next;
    if (k + CHUNK < k_end) {
      load_weights(k + CHUNK);
      load_x(k + CHUNK);
    }
    // Step i, product h: a0..a3 = words 2h, 2h of row g + 8, 2h + 1, 2h + 1 of row g + 8.
#pragma unroll
    for (int i = 0; i < STEPS; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < NT; ++j)
            Ops::mma(acc[mt][j], word(cur.a[j][i], 2 * h), word(cur.b[j][i], 2 * h),
                     word(cur.a[j][i], 2 * h + 1), word(cur.b[j][i], 2 * h + 1),
                     word(cur.x[mt][i], 2 * h), word(cur.x[mt][i], 2 * h + 1));
  }

  // The CTA's warps hold K ranges of the same tile: add them up in warp 0.
  if (!octavo::cta_sum<NT>(acc, warp, warps, lane)) return;

  // fn(accumulator, output feature n, offset in [M, N]) for each of the lane's outputs in
  // the batch: d[i] is feature n0 + 16 j + g (+ 8 for i >= 2) at row mt * 8 + 2t + (i & 1).
  auto each_output = [&](auto fn) {
    octavo::each_row<MT>(t, M, [&](int mt, int i, int m) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int n = n0 + 16 * j + g + (i < 2 ? 0 : 8);
        fn(acc[mt][j][i], n, (size_t)m * N + n);
      }
    });
  };
  auto store = [&](float a, int n, size_t o) {
    out[o] = Ops::from_float(bias ? a + Ops::to_float(bias[n]) : a);
  };
  const int splits = gridDim.y;
  if (splits == 1) {
    each_output(store);
    return;
  }
  each_output([&](float a, int, size_t o) { part[(size_t)blockIdx.y * M * N + o] = a; });
  // Split over CTAs: the CTA that takes the tile's last ticket adds the partials in split
  // order (deterministic), writes the output and leaves the counter zeroed for the next call.
  if (!octavo::last_ticket(cnt + tile, splits, lane)) return;
  each_output([&](float, int n, size_t o) {
    const float total = octavo::split_sum(part, splits, (size_t)M * N, o);
    store(total, n, o);
  });
  octavo::release_tile(cnt + tile, lane);
}

}  // namespace

#define OCTAVO_DENSE_MMA(TNAME, T, MT, NT, STEPS)                                             \
  extern "C" __global__ void __launch_bounds__(256)                                           \
      dense_mma_##TNAME##_m##MT##_n##NT##_s##STEPS(                                           \
          const T* x, const uint4* w, const T* bias, T* out, float* part, int* cnt, int M,    \
          int N, int K, int stride_x, int k_per_warp) {                                       \
    dense_mma<T, MT, NT, STEPS>(x, w, bias, out, part, cnt, M, N, K, stride_x, k_per_warp);   \
  }

// (MT, NT, STEPS) built: octavo/kernels/dense_mma.py's VARIANTS, those whose two chunks of
// operands in registers ((2 NT + MT) STEPS uint4, twice) fit in 255 registers without spills
// (ptxas for sm_90, bf16 and fp16 alike; m2_n1_s8, m1_n2_s8 and m4_n2_s4 spilled 144-784 bytes).
#define OCTAVO_DENSE_MMA_ALL(TNAME, T) \
  OCTAVO_DENSE_MMA(TNAME, T, 1, 1, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, 1, 1, 2) \
  OCTAVO_DENSE_MMA(TNAME, T, 1, 1, 4) \
  OCTAVO_DENSE_MMA(TNAME, T, 1, 1, 8) \
  OCTAVO_DENSE_MMA(TNAME, T, 1, 2, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, 1, 2, 2) \
  OCTAVO_DENSE_MMA(TNAME, T, 1, 2, 4) \
  OCTAVO_DENSE_MMA(TNAME, T, 2, 1, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, 2, 1, 2) \
  OCTAVO_DENSE_MMA(TNAME, T, 2, 1, 4) \
  OCTAVO_DENSE_MMA(TNAME, T, 2, 2, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, 2, 2, 2) \
  OCTAVO_DENSE_MMA(TNAME, T, 2, 2, 4) \
  OCTAVO_DENSE_MMA(TNAME, T, 4, 1, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, 4, 1, 2) \
  OCTAVO_DENSE_MMA(TNAME, T, 4, 1, 4) \
  OCTAVO_DENSE_MMA(TNAME, T, 4, 2, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, 4, 2, 2)

OCTAVO_DENSE_MMA_ALL(bf16, __nv_bfloat16)
OCTAVO_DENSE_MMA_ALL(f16, __half)
