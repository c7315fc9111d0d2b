// 4-bit weight-only GEMM for batches of 17 to a few hundred rows over the swap-AB layout of
// octavo/kernels/w4a16_swapab.py: out [M, N] = x [M, K] @ dequant(W) [K, N] on mma.sync with
// the weights as the A operand. octavo/kernels/swapab_wide.py builds it, plans the launch
// and says why it exists (past 128 rows the engine dequantized the whole weight to bf16 and
// called cuBLAS: 4.5 bytes a weight through HBM against bf16's 2).
//
// A CTA is WARPS (4 or 8) warps over WARPS / 4 64-row blocks of int16 rows (256 output
// columns each: nibble c of int16 row R is column (R / 64) * 256 + 64 c + R % 64) and BM = 8 NT
// batch rows, over a range of K (its split, blockIdx.z). Warp w takes int16 rows 16 w ..
// 16 w + 15 of the CTA's, in swapab_mma.cu's fragment mapping: lane (g, t) loads 16 bytes
// of rows g and g + 8 at k + 8t per 32-wide step, one chunk (two steps) ahead in registers
// (WSMEM: copied into the stages with the activations, STAGES chunks ahead), and the two
// m16n8k16 products of a step (h = 0, 1) take physical K 8t + 4h + {0..3} as their logical
// columns {2t, 2t+1, 2t+8, 2t+9}. Unlike swapab_mma.cu (1-16 rows, zero points and scales applied
// per group on the accumulators) each weight pair is dequantized in the 16-bit type before
// its products: (bias + q) - (bias + z) is exact, times s rounded once, the value
// dequantize_swapab writes; one set of accumulators then holds 4 values x NT batch tiles.
// The activations come through shared memory, STAGES chunks of [BM, 64] in flight
// (cp.async, every thread of the CTA copying), each 16-byte piece of a row stored at piece
// p ^ 4 (row & 1): a quarter warp's loads (rows g, g + 1, pieces t) then hit 8 distinct
// bank groups. Splits over K: each warp's outputs are its own, so each warp stores its
// partials, takes a ticket of its own and the last one adds them in split order.
// tests/kernels/test_swapab_wide.py emulates this mapping lane by lane on the CPU.

#include "mma_common.cuh"

namespace {

using octavo::nibbles;
using octavo::stored_float;
using octavo::word;

template <typename T>
struct Wide : octavo::MmaType<T>, octavo::Int4<T> {
  static constexpr bool kBf16 = octavo::MmaType<T>::kBf16;
  static __device__ __forceinline__ uint32_t pair(float v) {  // v in both halves
    const T h = octavo::MmaType<T>::from_float(v);
    const uint32_t b = *reinterpret_cast<const unsigned short*>(&h);
    return b | (b << 16);
  }
  // (v - zb) * s per half: the difference exact (integers of a few bits), one rounding.
  static __device__ __forceinline__ uint32_t dequant(uint32_t v, uint32_t zb, uint32_t s) {
    uint32_t d, r;
    if constexpr (kBf16) {
      asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(zb), "r"(0xBF80BF80u), "r"(v));
      asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(d), "r"(s), "r"(0x80008000u));
    } else {
      asm("sub.f16x2 %0, %1, %2;" : "=r"(d) : "r"(v), "r"(zb));
      asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(d), "r"(s));
    }
    return r;
  }
};

constexpr int kChunk = 64;  // K per chunk: two 32-wide steps

// Shared memory of one stage, in 16-byte pieces: activations [8 NT rows, 64 K], the CTA's
// 64 WARPS columns of scales and of zeros, and (WSMEM) each warp's weights (2 steps x rows
// g, g + 8 x 32 lanes). octavo/kernels/swapab_wide.py's stage_bytes says the same.
template <int NT, int WARPS, bool WSMEM>
__host__ __device__ constexpr int stage_pieces() {
  return 8 * NT * kChunk / 8 + 2 * (64 * WARPS / 8) + (WSMEM ? WARPS * 128 : 0);
}

template <typename T, typename S, int NT, int WARPS, int STAGES, bool WSMEM>
__device__ __forceinline__ void swapab_wide(
    const T* __restrict__ x, const uint4* __restrict__ w, const unsigned short* __restrict__ s,
    const unsigned short* __restrict__ z, T* __restrict__ out, float* __restrict__ part,
    int* __restrict__ cnt, int M, int N, int K, int stride_x, int k_per_split, int group) {
  using W = Wide<T>;
  constexpr int BM = 8 * NT;
  constexpr int PIECES = BM * kChunk / 8;  // 16-byte pieces of a stage's activations
  constexpr int COLS = 64 * WARPS;  // output columns of the CTA
  constexpr int SZ = COLS / 8;  // 16-byte pieces of a group's scales (of its zeros as many)
  constexpr int STAGE = stage_pieces<NT, WARPS, WSMEM>();
  extern __shared__ uint4 ring[];  // STAGES stages of STAGE pieces
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.y * BM, col0 = blockIdx.x * COLS;
  const int k_begin = blockIdx.z * k_per_split;
  const int k_end = min(k_begin + k_per_split, K);
  const int chunks = k_begin < k_end ? (k_end - k_begin) / kChunk : 0;
  const int row = blockIdx.x * 16 * WARPS + warp * 16 + g;  // the lane's rows: row, row + 8
  const uint4* wa = w + ((size_t)row * K + 8 * t) / 8;
  const uint4* wb = w + ((size_t)(row + 8) * K + 8 * t) / 8;
  const int n0 = (row >> 6) * 256 + (row & 63);  // columns of value 0 of rows row, row + 8
  const int n1 = n0 + 8;

  // A stage: the chunk's activations [BM, 64] (16-byte pieces, swizzled), then the CTA's
  // columns of the chunk's group: scales, then zero points, as stored; then (WSMEM) the
  // warps' weights, each lane copying the 4 pieces it reads back.
  auto stage_at = [&](int stage) { return ring + stage * STAGE; };
  auto issue_weights = [&](int stage, int k) {
    uint4* ws = stage_at(stage) + PIECES + 2 * SZ + warp * 128;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      octavo::cp_async16(ws + (2 * i) * 32 + lane, wa + (k / 32 + i) * 4);
      octavo::cp_async16(ws + (2 * i + 1) * 32 + lane, wb + (k / 32 + i) * 4);
    }
  };
  auto issue = [&](int stage, int k) {
#pragma unroll
    for (int i = 0; i < PIECES / (32 * WARPS); ++i) {
      const int idx = threadIdx.x + 32 * WARPS * i;
      const int r = idx >> 3, p = idx & 7;
      const bool in = m0 + r < M;
      octavo::cp_async16(stage_at(stage) + r * 8 + (p ^ ((r & 1) << 2)),
                         in ? x + (size_t)(m0 + r) * stride_x + k + 8 * p : x, in);
    }
    if (threadIdx.x < 2 * SZ) {  // SZ pieces of scales, SZ of zeros
      const unsigned short* src = (threadIdx.x < SZ ? s : z) + (size_t)(k / group) * N + col0 +
                                  8 * (threadIdx.x % SZ);
      octavo::cp_async16(stage_at(stage) + PIECES + threadIdx.x, src);
    }
  };
  uint4 na[2], nb[2];  // the next chunk's weights (not WSMEM)
  auto load_weights = [&](int k) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      na[i] = __ldg(wa + (k / 32 + i) * 4);
      nb[i] = __ldg(wb + (k / 32 + i) * 4);
    }
  };
  uint32_t sc[4][2], zb[4][2];  // the current group's scales and bias + zeros, in pairs
  auto take_group = [&](const uint4* stage) {
    const unsigned short* sz = reinterpret_cast<const unsigned short*>(stage + PIECES);
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int col = n0 - col0 + 8 * r + 64 * c;
        sc[c][r] = W::pair(stored_float<S>(sz[col]));
        zb[c][r] = W::pair(stored_float<S>(sz[COLS + col]) + W::kBias);
      }
  };

  float acc[NT][4][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][c][i] = 0.f;

  // The weights are constants: on their way while the last kernel ends (WSMEM: the first
  // stages' copies join the first stage's group).
  if constexpr (WSMEM) {
#pragma unroll
    for (int j = 0; j < STAGES - 1; ++j)
      if (j < chunks) issue_weights(j, k_begin + j * kChunk);
  } else {
    if (chunks > 0) load_weights(k_begin);
  }
  octavo::pdl_wait();
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) {
    if (j < chunks) issue(j, k_begin + j * kChunk);
    octavo::cp_async_commit();
  }
  for (int j = 0; j < chunks; ++j) {
    const int k = k_begin + j * kChunk;
    uint4 ca[2], cb[2];
    if constexpr (!WSMEM) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        ca[i] = na[i];
        cb[i] = nb[i];
      }
      if (j + 1 < chunks) load_weights(k + kChunk);
    }
    octavo::cp_async_wait<STAGES - 2>();  // this thread's copies of chunk j are in
    __syncthreads();  // everyone's are, and everyone is done with chunk j - 1's stage
    if (j + STAGES - 1 < chunks) {
      const int next = (j + STAGES - 1) % STAGES, kn = k + (STAGES - 1) * kChunk;
      if constexpr (WSMEM) issue_weights(next, kn);
      issue(next, kn);
    }
    octavo::cp_async_commit();
    const uint4* st = stage_at(j % STAGES);
    if constexpr (WSMEM) {
      const uint4* ws = st + PIECES + 2 * SZ + warp * 128;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        ca[i] = ws[(2 * i) * 32 + lane];
        cb[i] = ws[(2 * i + 1) * 32 + lane];
      }
    }
    if (j == 0 || k % group == 0) take_group(st);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t a[2][4][4];  // [h][value c][register]
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t ra0 = word(ca[i], 2 * h), ra1 = word(ca[i], 2 * h + 1);
        const uint32_t rb0 = word(cb[i], 2 * h), rb1 = word(cb[i], 2 * h + 1);
#define OCTAVO_WIDE_VALUE(C)                                                  \
  a[h][C][0] = W::dequant(nibbles<T, C>(ra0), zb[C][0], sc[C][0]);            \
  a[h][C][1] = W::dequant(nibbles<T, C>(rb0), zb[C][1], sc[C][1]);            \
  a[h][C][2] = W::dequant(nibbles<T, C>(ra1), zb[C][0], sc[C][0]);            \
  a[h][C][3] = W::dequant(nibbles<T, C>(rb1), zb[C][1], sc[C][1]);
        OCTAVO_WIDE_VALUE(0)
        OCTAVO_WIDE_VALUE(1)
        OCTAVO_WIDE_VALUE(2)
        OCTAVO_WIDE_VALUE(3)
#undef OCTAVO_WIDE_VALUE
      }
#pragma unroll
      for (int jt = 0; jt < NT; ++jt) {
        const int r = jt * 8 + g;
        const uint4 xv = st[r * 8 + ((4 * i + t) ^ ((r & 1) << 2))];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t b0 = word(xv, 2 * h), b1 = word(xv, 2 * h + 1);
#pragma unroll
          for (int c = 0; c < 4; ++c)
            W::mma(acc[jt][c], a[h][c][0], a[h][c][1], a[h][c][2], a[h][c][3], b0, b1);
        }
      }
    }
  }
  octavo::cp_async_wait<0>();

  // fn(accumulator, offset in [M, N]) for each of the lane's outputs: d[i] is column
  // (i < 2 ? n0 : n1) + 64 c at batch row m0 + 8 jt + 2t + (i & 1).
  auto each_output = [&](auto fn) {
    octavo::each_row<NT>(t, M - m0, [&](int jt, int i, int m) {
      const int nb = i < 2 ? n0 : n1;
#pragma unroll
      for (int c = 0; c < 4; ++c) fn(acc[jt][c][i], (size_t)(m0 + m) * N + nb + 64 * c);
    });
  };
  const int splits = gridDim.z;
  if (splits == 1) {
    each_output([&](float a, size_t o) { out[o] = W::from_float(a); });
    return;
  }
  each_output([&](float a, size_t o) { part[(size_t)blockIdx.z * M * N + o] = a; });
  int* ticket = cnt + ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * WARPS + warp;
  if (!octavo::last_ticket(ticket, splits, lane)) return;
  each_output([&](float& a, size_t) { a = 0.f; });
  for (int sp = 0; sp < splits; ++sp) {
    const float* ps = part + (size_t)sp * M * N;
    each_output([&](float& a, size_t o) { a += __ldcg(ps + o); });
  }
  each_output([&](float& a, size_t o) { out[o] = W::from_float(a); });
  octavo::release_tile(ticket, lane);
}

}  // namespace

// swapab_wide_{activations}_{scales}_m{NT}_w{WARPS}_p{STAGES}[_ws]: grid (N / (64 WARPS)
// column tiles, batch tiles of 8 NT rows, K splits), 32 WARPS threads, STAGES stages of
// dynamic shared memory; _ws: the weights through it too.
#define OCTAVO_SWAPAB_WIDE(TN, T, SN, S, NT, WARPS, STAGES, WSMEM, SUFFIX)                     \
  extern "C" __global__ void __launch_bounds__(32 * WARPS)                                     \
      swapab_wide_##TN##_##SN##_m##NT##_w##WARPS##_p##STAGES##SUFFIX(                          \
          const T* x, const uint4* w, const unsigned short* s, const unsigned short* z,        \
          T* out, float* part, int* cnt, int M, int N, int K, int stride_x, int k_per_split,   \
          int group) {                                                                         \
    swapab_wide<T, S, NT, WARPS, STAGES, WSMEM>(x, w, s, z, out, part, cnt, M, N, K,          \
                                                stride_x, k_per_split, group);                 \
  }

#define OCTAVO_SWAPAB_WIDE_ALL(TN, T, SN, S)             \
  OCTAVO_SWAPAB_WIDE(TN, T, SN, S, 4, 4, 3, false, )     \
  OCTAVO_SWAPAB_WIDE(TN, T, SN, S, 8, 4, 3, false, )     \
  OCTAVO_SWAPAB_WIDE(TN, T, SN, S, 4, 8, 3, false, )     \
  OCTAVO_SWAPAB_WIDE(TN, T, SN, S, 8, 8, 3, false, )     \
  OCTAVO_SWAPAB_WIDE(TN, T, SN, S, 4, 4, 4, true, _ws)   \
  OCTAVO_SWAPAB_WIDE(TN, T, SN, S, 8, 4, 4, true, _ws)   \
  OCTAVO_SWAPAB_WIDE(TN, T, SN, S, 8, 8, 4, true, _ws)

OCTAVO_SWAPAB_WIDE_ALL(bf16, __nv_bfloat16, bf16, __nv_bfloat16)
OCTAVO_SWAPAB_WIDE_ALL(bf16, __nv_bfloat16, f16, __half)
OCTAVO_SWAPAB_WIDE_ALL(f16, __half, bf16, __nv_bfloat16)
OCTAVO_SWAPAB_WIDE_ALL(f16, __half, f16, __half)
