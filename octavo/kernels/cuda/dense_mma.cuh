// Float (bf16 / fp16) GEMM for decode batches (M <= 32): y [M, N] = x [M, K] @ W [N, K]^T
// (+ bias), W in nn.Linear's layout as it is, on the tensor cores' mma.sync with the weights
// as the A operand: y^T [N, M] = W [N, K] @ x^T [K, M]. W is either of x's type (the kernels
// of dense_mma.cu) or float8 e4m3 with a float32 scale per output feature (Weights<T, E4m3>,
// the kernels of dense_mma_fp8.cu: a model of 16-bit weights never builds them).
// octavo/kernels/dense_mma.py builds both (nvcc, at first use), plans the launch and says why
// it is shaped this way.
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

#pragma once

#include "mma_common.cuh"

namespace {

using octavo::word;

struct E4m3 {};  // the weight type tag of float8 e4m3 weights

// What differs between weight types: the K values of a lane's 16-byte load (a step is 4 of
// them), the activations' uint4 per step and batch tile, and the operands of product p of a
// step (P of them), from the step's weight loads of rows g and g + 8 and its activations.
template <typename T, typename W>
struct Weights {  // W = T: 16-bit weights, products h = 0, 1 as in the header comment
  static constexpr int kStepK = 32, kXVec = 1, kProducts = 2;
  // The K loop's two chunks used in turn (unrolled twice) or the next one copied into the
  // current one each chunk. H200 (session 20): in turn, one Qwen3-0.6B layer's four GEMMs
  // took 14.6 -> 13.1 us alone at one row, but W4 batch 1 read 0.975-0.986 ms per token
  // against a501332's 0.892; it read 0.983 against 0.934 with the copy back too, so that
  // regression is not the loop's and the loop's own effect in the engine is unmeasured.
  // 16-bit weights copy, as measured before, until it is.
  static constexpr bool kTwoChunks = false;
  static constexpr float kOutScale = 1.f;
  static __device__ __forceinline__ void a(const uint4& ra, const uint4& rb, int p,
                                           uint32_t (&r)[4]) {
    r[0] = word(ra, 2 * p); r[1] = word(rb, 2 * p);
    r[2] = word(ra, 2 * p + 1); r[3] = word(rb, 2 * p + 1);
  }
  static __device__ __forceinline__ void b(const uint4 (&x)[kXVec], int p, uint32_t (&r)[2]) {
    r[0] = word(x[0], 2 * p); r[1] = word(x[0], 2 * p + 1);
  }
};

// Float8 e4m3 weights: a lane's 16 bytes are 16 K values, a step 64; product p takes word p
// of each row (physical K 16t + 4p + {0..3}). The conversion is exact and costs 3-4 integer
// operations per two weights; the per-feature scale is applied once, in the final store.
// - fp16 activations: cvt.rn.f16x2.e4m3x2 (sm_89+) gives each pair of bytes as f16x2, in
//   order: a0 = bytes {0, 1}, a2 = bytes {2, 3} of row g, the activations as loaded.
// - bf16 activations: bf16 has no e4m3 conversion; the bits are placed instead: sign to bit
//   15, exponent and mantissa to bits 10..4 (their bf16 places with the exponent biased 7, not
//   127), which is w * 2^-120 exactly (e4m3 subnormals become bf16 subnormals). Bytes {0, 2}
//   come out of one word's shift and {1, 3} of the other, so the products take physical K
//   {+0, +2} as logical columns {2t, 2t+1} and {+1, +3} as {2t+8, 2t+9}, and the activations
//   are paired the same way by a byte permute (per activation, shared by the warp's feature
//   tiles). They also take 2^64 (exact in bf16 for |x| < 2^64), so each product is
//   w x 2^-56: a normal float32 for |w x| >= 2^-70; the store multiplies 2^56 back.
template <typename T>
struct Weights<T, E4m3> {
  static constexpr bool kBf16 = octavo::MmaType<T>::kBf16;
  static constexpr int kStepK = 64, kXVec = 2, kProducts = 4;
  // In turn: Llama-8B fp8 batches 2 / 4 / 8 3.852 / 4.352 / 4.308 -> 3.629 / 3.955 / 4.127 ms.
  static constexpr bool kTwoChunks = true;
  static constexpr float kOutScale = kBf16 ? 72057594037927936.f : 1.f;  // 2^56
  static __device__ __forceinline__ void pair(uint32_t q, uint32_t& lo, uint32_t& hi) {
    if constexpr (kBf16) {
      hi = ((q & 0x7F007F00u) >> 4) | (q & 0x80008000u);  // bytes 1, 3
      const uint32_t q8 = q << 8;
      lo = ((q8 & 0x7F007F00u) >> 4) | (q8 & 0x80008000u);  // bytes 0, 2
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
      asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
          "cvt.rn.f16x2.e4m3x2 %1, h;\n}"
          : "=r"(lo), "=r"(hi) : "r"(q));
#else
      lo = hi = 0;
      __trap();  // never launched: dense_mma.py sends float8 weights on sm_89+ only
#endif
    }
  }
  static __device__ __forceinline__ void a(const uint4& ra, const uint4& rb, int p,
                                           uint32_t (&r)[4]) {
    pair(word(ra, p), r[0], r[2]);
    pair(word(rb, p), r[1], r[3]);
  }
  static __device__ __forceinline__ void b(const uint4 (&x)[kXVec], int p, uint32_t (&r)[2]) {
    const uint32_t x0 = word(x[p / 2], 2 * (p % 2)), x1 = word(x[p / 2], 2 * (p % 2) + 1);
    if constexpr (kBf16) {
      constexpr uint32_t kTwo64 = 0x5F805F80u, kMinusZero = 0x80008000u;  // bf16x2 2^64, -0
      const uint32_t even = __byte_perm(x0, x1, 0x5410), odd = __byte_perm(x0, x1, 0x7632);
      asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r[0]) : "r"(even), "r"(kTwo64), "r"(kMinusZero));
      asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r[1]) : "r"(odd), "r"(kTwo64), "r"(kMinusZero));
    } else {
      r[0] = x0;
      r[1] = x1;
    }
  }
};

template <typename T, typename W, int MT, int NT, int STEPS>
__device__ __forceinline__ void dense_mma(
    const T* __restrict__ x, const uint4* __restrict__ w, const T* __restrict__ bias,
    const float* __restrict__ scale, T* __restrict__ out, float* __restrict__ part,
    int* __restrict__ cnt, int M, int N, int K, int stride_x, int k_per_warp) {
  using Ops = octavo::MmaType<T>;
  using Wt = Weights<T, W>;
  constexpr int XV = Wt::kXVec;
  constexpr int CHUNK = Wt::kStepK * STEPS;
  constexpr int VALUES = Wt::kStepK / 4;  // per 16-byte load
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int tile = blockIdx.x;  // NT * 16 output features
  // This warp's K range: its share of the CTA's split (blockIdx.y).
  const int k_begin = (blockIdx.y * warps + warp) * k_per_warp;
  const int k_end = min(k_begin + k_per_warp, K);
  // Rows n0(j) + g and n0(j) + g + 8 of tile j: step k of row R at R * K + k, 4 uint4 a step.
  const int n0 = tile * NT * 16;
  const uint4* wrow = w + ((size_t)(n0 + g) * K + VALUES * t) / VALUES;
  const size_t row8 = (size_t)8 * K / VALUES;  // 8 rows further, in uint4

  // Software pipeline, one chunk deep: the next chunk's weights and activations are loaded
  // before this chunk's products, so no load's latency (DRAM for the weights, L2 for x) is
  // waited for inside a chunk.
  struct Chunk {
    uint4 a[NT][STEPS], b[NT][STEPS];  // weight rows g and g + 8 of each tile
    uint4 x[MT][STEPS * XV];           // activation row g of each batch tile
  };
  auto load = [&](Chunk& c, int k, bool weights, bool acts) {
    if (weights) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4* wa = wrow + (size_t)j * 2 * row8;  // tile j: 16 rows further
#pragma unroll
        for (int i = 0; i < STEPS; ++i) {
          c.a[j][i] = __ldg(wa + (k / Wt::kStepK + i) * 4);
          c.b[j][i] = __ldg(wa + row8 + (k / Wt::kStepK + i) * 4);
        }
      }
    }
    if (acts) octavo::load_x<XV>(c.x, x, M, stride_x, k, g, t);
  };
  float acc[MT][NT][4] = {};
  auto products = [&](const Chunk& cur) {
#pragma unroll
    for (int i = 0; i < STEPS; ++i)
#pragma unroll
      for (int p = 0; p < Wt::kProducts; ++p) {
        uint32_t a[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) Wt::a(cur.a[j][i], cur.b[j][i], p, a[j]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          uint32_t b[2];
          Wt::b(*reinterpret_cast<const uint4(*)[XV]>(&cur.x[mt][i * XV]), p, b);
#pragma unroll
          for (int j = 0; j < NT; ++j)
            Ops::mma(acc[mt][j], a[j][0], a[j][1], a[j][2], a[j][3], b[0], b[1]);
        }
      }
  };
  Chunk c0, c1;
  if (k_begin < k_end) load(c0, k_begin, true, false);
  octavo::pdl_wait();  // the first weights are on their way while the previous kernel ends
  if (k_begin < k_end) load(c0, k_begin, false, true);
  if constexpr (Wt::kTwoChunks) {
    // The two chunks used in turn (the loop unrolled twice): no chunk copied into the other.
    for (int k = k_begin; k < k_end; k += 2 * CHUNK) {
      if (k + CHUNK < k_end) load(c1, k + CHUNK, true, true);
      products(c0);
      if (k + CHUNK >= k_end) break;
      if (k + 2 * CHUNK < k_end) load(c0, k + 2 * CHUNK, true, true);
      products(c1);
    }
  } else {
    for (int k = k_begin; k < k_end; k += CHUNK) {
      c1 = c0;
      if (k + CHUNK < k_end) load(c0, k + CHUNK, true, true);
      products(c1);
    }
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
  // The epilogue in two passes: every output's scale and bias first (their loads all in
  // flight at once), then the stores. One pass loaded, computed and stored an output at a
  // time: a store may alias the next output's scale or bias as far as the compiler knows,
  // so each output waited for its loads (SASS: LDG LDG FMUL FADD STG, output by output).
  // (The scale and bias tests outside the passes: a branch per output kept them apart too.)
  auto store = [&]() {
    if (scale) each_output([&](float& a, int n, size_t) { a *= scale[n] * Wt::kOutScale; });
    if (bias) each_output([&](float& a, int n, size_t) { a += Ops::to_float(bias[n]); });
    each_output([&](float& a, int, size_t o) { out[o] = Ops::from_float(a); });
  };
  const int splits = gridDim.y;
  if (splits == 1) {
    store();
    return;
  }
  each_output([&](float a, int, size_t o) { part[(size_t)blockIdx.y * M * N + o] = a; });
  // Split over CTAs: the CTA that takes the tile's last ticket adds the partials in split
  // order (deterministic), writes the output and leaves the counter zeroed for the next call.
  if (!octavo::last_ticket(cnt + tile, splits, lane)) return;
  // The accumulators become the sums of the partials in split order (deterministic), read
  // from L2 where the other SMs wrote them (.cg: not a stale L1 line): each split's partials
  // of all the lane's outputs at once, one L2 round trip a split; an output at a time cost
  // one round trip an output (in the one warp that adds them).
  each_output([&](float& a, int, size_t) { a = 0.f; });
  for (int sp = 0; sp < splits; ++sp) {
    const float* ps = part + (size_t)sp * M * N;
    each_output([&](float& a, int, size_t o) { a += __ldcg(ps + o); });
  }
  store();
  octavo::release_tile(cnt + tile, lane);
}

}  // namespace

// dense_mma_{activations}[_e4m3]_m{MT}_n{NT}_s{STEPS}; scale is read for e4m3 weights only.
#define OCTAVO_DENSE_MMA(TNAME, T, WNAME, W, MT, NT, STEPS)                                    \
  extern "C" __global__ void __launch_bounds__(256)                                           \
      dense_mma_##TNAME##WNAME##_m##MT##_n##NT##_s##STEPS(                                    \
          const T* x, const uint4* w, const T* bias, const float* scale, T* out, float* part, \
          int* cnt, int M, int N, int K, int stride_x, int k_per_warp) {                      \
    dense_mma<T, W, MT, NT, STEPS>(x, w, bias, std::is_same<W, E4m3>::value ? scale : nullptr, \
                                   out, part, cnt, M, N, K, stride_x, k_per_warp);            \
  }
