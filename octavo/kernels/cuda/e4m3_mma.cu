// FP8 x FP8 (W8A8, e4m3) GEMM for decode batches (M <= 8): y [M, N] = sx[m] * sw[n] *
// (q(x) [M, K] @ W [N, K]^T), W the float8 weight in nn.Linear's layout as loaded, q(x) the
// activations quantized to e4m3 in this kernel (per token or per tensor, dynamic or static:
// the rule of octavo/kernels/fp8_quant.py, bit for bit), the products on the tensor cores'
// float8 mma.sync (m16n8k32, sm_89+) with float32 accumulation. octavo/kernels/e4m3_mma.py
// plans the launch and says why it is shaped this way.
//
// Mapping. A warp takes a tile of 16 weight rows over the CTA's K range, in steps of 64: lane
// (g = lane / 4, t = lane % 4) loads 16 bytes of rows g and g + 8 at k + 16t. The sum over K
// does not care which K value the mma calls which, so the two products of a step (p = 0, 1)
// take words 2p and 2p + 1 of the lane's 16 bytes as their logical columns 4t..4t+3 and
// 16+4t..16+4t+3: a0 = word 2p of row g, a1 = word 2p of row g + 8, a2 = word 2p + 1 of row g,
// a3 = word 2p + 1 of row g + 8. The activations (B operand, batch row g) are read the same
// way from the quantized copy in shared memory: b0 = word 2p, b1 = word 2p + 1. Every operand
// register is a loaded register as it stands: no conversion, no shuffle.
//
// A CTA's warps take different tiles over the same K range (blockIdx.y's split), so the CTA
// quantizes only that range of x, once, into shared memory; the scale needs the whole row's
// amax, which every CTA reads (from L2). A warp walks its tiles (warp, warp + stride, ...)
// as one flat sequence of chunks, each chunk's weights loaded one chunk ahead, so the
// pipeline does not drain between tiles. Splits over K add their float32 partials through
// global memory: the warp that takes a tile's last ticket sums them in split order
// (deterministic), scales, stores and zeroes the counter (octavo.kernels.split_k).
// tests/kernels/test_e4m3_mma.py emulates this mapping lane by lane on the CPU.

#include "mma_common.cuh"

namespace {

using octavo::MmaType;

// One m16n8k32 float8 product with float32 accumulators.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // never launched: e4m3_mma.py sends float8 layers on sm_89+ only
#endif
}

// Two float32 as e4m3 (lo in the low byte), rounded to nearest even, saturated at +-448
// (what torch's clamp(-448, 448) then cast gives; NaN stays NaN).
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  unsigned short r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

// Scale rules (the flags argument): a static scale (read from x_scale), the amax over every
// row (per tensor) instead of per row, and a zero scale replaced by min_scale instead of every
// scale raised to it (fp8_quant.py's "replace" and "clamp").
constexpr int kStatic = 1, kPerTensor = 2, kReplace = 4;
constexpr int kMaxM = 8;

template <typename T, int STEPS>
__device__ __forceinline__ void e4m3_mma(
    const T* __restrict__ x, const uint4* __restrict__ w, const float* __restrict__ w_scale,
    const float* __restrict__ x_scale, T* __restrict__ out, float* __restrict__ part,
    int* __restrict__ cnt, int M, int N, int K, int stride_x, int k_per_split,
    float min_scale, int flags) {
  using Ops = MmaType<T>;
  constexpr int CHUNK = 64 * STEPS;
  extern __shared__ uint4 xq_shared[];  // q(x) [M][k_per_split] bytes
  __shared__ float red[octavo::kMaxWarps][kMaxM];
  __shared__ float sx[kMaxM];
  const unsigned char* xq = reinterpret_cast<const unsigned char*>(xq_shared);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int kb = blockIdx.y * k_per_split;
  const int kn = min(k_per_split, K - kb);  // this CTA's K range: [kb, kb + kn)
  const int cpt = kn / CHUNK;               // chunks per tile
  const int tiles = N / 16;
  const int first = blockIdx.x * warps + warp, stride = gridDim.x * warps;
  const int mine = first < tiles ? (tiles - 1 - first) / stride + 1 : 0;  // tiles of this warp
  const int total = mine * cpt;  // flat chunks of this warp
  const size_t row_words = (size_t)K / 16;  // uint4 per weight row
  const uint4* wlane = w + g * row_words + t;

  struct Chunk {
    uint4 a[STEPS], b[STEPS];  // rows g and g + 8
  };
  // The loads walk the flat chunk sequence with a pointer and a chunk count in the tile (no
  // division per chunk): CHUNK / 16 uint4 further each chunk, the next tile at a wrap.
  const uint4* lp = wlane + (size_t)first * 16 * row_words + kb / 16;
  int lk = 0;
  const size_t next_tile = (size_t)stride * 16 * row_words - (size_t)(cpt - 1) * (CHUNK / 16);
  auto load = [&](Chunk& c) {
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
      c.a[s] = __ldg(lp + 4 * s);
      c.b[s] = __ldg(lp + 8 * row_words + 4 * s);
    }
    if (++lk == cpt) {
      lk = 0;
      lp += next_tile;
    } else {
      lp += CHUNK / 16;
    }
  };
  Chunk c0, c1;
  if (total > 0) load(c0);
  octavo::pdl_wait();  // the first weights are on their way while the previous kernel ends

  // The activations' scales: static, or amax / 448 over each row (every row: per tensor).
  const int tid = threadIdx.x, nthreads = blockDim.x;
  if (flags & kStatic) {
    if (tid < M) sx[tid] = __ldg(x_scale);
  } else {
    for (int m = 0; m < M; ++m) {
      float a = 0.f;
      const T* row = x + (size_t)m * stride_x;
      for (int i = tid; i < K / 8; i += nthreads) {
        const uint4 v = *reinterpret_cast<const uint4*>(row + 8 * i);
        const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (int q = 0; q < 8; ++q) a = fmaxf(a, fabsf(Ops::to_float(e[q])));
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
      if (lane == 0) red[warp][m] = a;
    }
    __syncthreads();
    if (tid < M) {
      float a = 0.f;
      for (int v = 0; v < warps; ++v)
        for (int m = 0; m < M; ++m)
          if (m == tid || (flags & kPerTensor)) a = fmaxf(a, red[v][m]);
      float s = __fdiv_rn(a, 448.f);
      s = (flags & kReplace) ? (s > 0.f ? s : min_scale) : fmaxf(s, min_scale);
      sx[tid] = s;
    }
  }
  __syncthreads();
  // q(x) of this CTA's K range: x / scale (IEEE division), saturated, rounded to e4m3.
  for (int m = 0; m < M; ++m) {
    const float s = sx[m];
    const T* row = x + (size_t)m * stride_x + kb;
    uint2* dst = reinterpret_cast<uint2*>(xq_shared) + (size_t)m * k_per_split / 8;
    for (int i = tid; i < kn / 8; i += nthreads) {
      const uint4 v = *reinterpret_cast<const uint4*>(row + 8 * i);
      const T* e = reinterpret_cast<const T*>(&v);
      uint32_t q[4];
#pragma unroll
      for (int h = 0; h < 4; ++h)
        q[h] = e4m3x2(__fdiv_rn(Ops::to_float(e[2 * h]), s),
                      __fdiv_rn(Ops::to_float(e[2 * h + 1]), s));
      dst[i] = make_uint2(q[0] | (q[1] << 16), q[2] | (q[3] << 16));
    }
  }
  __syncthreads();

  const unsigned char* xrow = xq + (size_t)g * k_per_split + 16 * t;
  float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
  int pk = 0, tile = first;  // the products' chunk in the tile, and the tile
  auto products = [&](const Chunk& c) {
    const int kc = pk * CHUNK;
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
      const uint4 xv = g < M ? *reinterpret_cast<const uint4*>(xrow + kc + 64 * s)
                             : make_uint4(0, 0, 0, 0);
      mma_e4m3(acc0, c.a[s].x, c.b[s].x, c.a[s].y, c.b[s].y, xv.x, xv.y);
      mma_e4m3(acc1, c.a[s].z, c.b[s].z, c.a[s].w, c.b[s].w, xv.z, xv.w);
    }
  };
  const int splits = gridDim.y;
  // A tile's last chunk done: d[i] is weight row n0 + g (+ 8 for i >= 2) at batch row
  // 2t + (i & 1) (the C fragment); store it (one split) or add it through the partials.
  auto finish = [&]() {
    float d[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      d[r] = acc0[r] + acc1[r];
      acc0[r] = acc1[r] = 0.f;
    }
    auto each = [&](auto fn) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int m = 2 * t + (r & 1);
        const int n = tile * 16 + g + (r < 2 ? 0 : 8);
        if (m < M) fn(d[r], m, n);
      }
    };
    auto store = [&](float v, int m, int n) {
      out[(size_t)m * N + n] = Ops::from_float(v * sx[m] * __ldg(w_scale + n));
    };
    if (splits == 1) {
      each(store);
      return;
    }
    each([&](float v, int m, int n) {
      part[((size_t)blockIdx.y * M + m) * N + n] = v;
    });
    if (!octavo::last_ticket(cnt + tile, splits, lane)) return;
    each([&](float, int m, int n) {
      store(octavo::split_sum(part, splits, (size_t)M * N, (size_t)m * N + n), m, n);
    });
    octavo::release_tile(cnt + tile, lane);
  };
  // After a chunk's products: the tile done at its last chunk (then the next tile).
  auto advance = [&]() {
    if (++pk < cpt) return;
    finish();
    pk = 0;
    tile += stride;
  };
  // The two chunks used in turn (unrolled twice): the next chunk's weights are loaded before
  // this chunk's products, without copying one chunk into the other.
  for (int i = 0; i < total; i += 2) {
    if (i + 1 < total) load(c1);
    products(c0);
    advance();
    if (i + 1 >= total) break;
    if (i + 2 < total) load(c0);
    products(c1);
    advance();
  }
}

}  // namespace

// e4m3_mma_{activations}_s{STEPS}
#define OCTAVO_E4M3_MMA(TNAME, T, STEPS)                                                      \
  extern "C" __global__ void __launch_bounds__(256) e4m3_mma_##TNAME##_s##STEPS(              \
      const T* x, const uint4* w, const float* w_scale, const float* x_scale, T* out,         \
      float* part, int* cnt, int M, int N, int K, int stride_x, int k_per_split,               \
      float min_scale, int flags) {                                                           \
    e4m3_mma<T, STEPS>(x, w, w_scale, x_scale, out, part, cnt, M, N, K, stride_x, k_per_split, \
                       min_scale, flags);                                                     \
  }

OCTAVO_E4M3_MMA(bf16, __nv_bfloat16, 2)
OCTAVO_E4M3_MMA(bf16, __nv_bfloat16, 4)
OCTAVO_E4M3_MMA(bf16, __nv_bfloat16, 8)
OCTAVO_E4M3_MMA(f16, __half, 2)
OCTAVO_E4M3_MMA(f16, __half, 4)
OCTAVO_E4M3_MMA(f16, __half, 8)
