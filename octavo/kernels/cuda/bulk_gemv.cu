// Float8 (e4m3) weights times bf16 / fp16 activations for decode batches of 1-2 rows, the
// weights streamed into shared memory by the copy engine (Hopper's bulk asynchronous copies,
// cp.async.bulk) instead of through registers: octavo/kernels/bulk_gemv.py says why.
//
// y[m, n] = scale[n] * sum_k x[m, k] * w[n, k], w [N, K] row-major (K contiguous, rows 16-byte
// aligned), one float32 scale per row, float32 products of the exact weight values (e4m3 ->
// f16 -> f32), rounded once to the output type.
//
// A CTA owns ROWS weight rows and walks all of K in chunks of CHUNK bytes per row. Warp WARPS
// (the producer) keeps STAGES chunks of its rows in flight: lane r copies row r's CHUNK bytes
// with one cp.async.bulk that completes on the stage's "full" barrier. Warps 0 .. WARPS - 1
// (the consumers) own ROWS / WARPS rows each; lane l reads 16 bytes at 512 j + 16 l of each
// row, and the 16 activations they meet, then frees the stage ("empty" barrier). A warp's
// row sums end in a shuffle reduction; lane 0 stores. GLU: rows 2p / 2p + 1 of the CTA are
// gate row p and up row I + p of a [gate | up] weight (N = 2I), and the store writes
// silu(gate) * up to column p, each first rounded to the output type (split_k.py's _store).
//
// PDL: the producer's first STAGES chunks are issued before anything waits (no kernel of the
// step writes weights); the consumers wait (griddepcontrol) before reading x and storing.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "mma_common.cuh"

namespace octavo {
namespace bulk {

__device__ __forceinline__ uint32_t smem(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void bar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem(bar)) : "memory");
}

__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];" ::"r"(smem(dst)),
      "l"(src), "r"(bytes), "r"(smem(bar))
      : "memory");
}

// The 4 e4m3 bytes of a word (byte i = weight i) as float32, exact.
__device__ __forceinline__ void e4m3x4(uint32_t w, float (&f)[4]) {
  uint32_t lo, hi;
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n"
      " cvt.rn.f16x2.e4m3x2 %1, b;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

// 8 activations (one uint4 of 16-bit values) as float32.
template <typename T>
__device__ __forceinline__ void x8(const uint4& v, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = word(v, i);
    if constexpr (MmaType<T>::kBf16) {
      f[2 * i] = __uint_as_float(u << 16);
      f[2 * i + 1] = __uint_as_float(u & 0xFFFF0000u);
    } else {
      const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&u));
      f[2 * i] = h.x;
      f[2 * i + 1] = h.y;
    }
  }
}

__device__ __forceinline__ float silu_mul(float g, float u) {
  float e;  // exp(-g) as Triton's tl.exp computes it: ex2.approx of g * log2(e)
  asm("ex2.approx.f32 %0, %1;" : "=f"(e) : "f"(-g * 1.4426950408889634f));
  return g / (1.0f + e) * u;
}

// The weight row that CTA row r reads (-1: past the end).
template <bool GLU>
__device__ __forceinline__ int weight_row(int tile, int rows, int r, int N) {
  if constexpr (GLU) {
    const int inter = N / 2, p = tile * (rows / 2) + r / 2;
    return p < inter ? p + (r % 2) * inter : -1;
  } else {
    const int n = tile * rows + r;
    return n < N ? n : -1;
  }
}

template <typename T, int M, int ROWS, int WARPS, int CHUNK, int STAGES, bool GLU>
__device__ __forceinline__ void gemv(const T* __restrict__ x, int stride_x,
                                     const uint8_t* __restrict__ w, int stride_w,
                                     const float* __restrict__ scale, T* __restrict__ out,
                                     int stride_o, int N, int K) {
  static_assert(ROWS <= 32 && ROWS % WARPS == 0 && CHUNK % 512 == 0, "plan");
  constexpr int RW = ROWS / WARPS;  // rows per consumer warp
  constexpr int J = CHUNK / 512;    // 16-byte pieces per lane per row and chunk
  static_assert(!GLU || RW % 2 == 0, "a warp owns whole gate / up pairs");
  extern __shared__ __align__(128) uint8_t ring[];  // [STAGES][ROWS][CHUNK]
  __shared__ uint64_t full[STAGES], empty[STAGES];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tile = blockIdx.x;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], WARPS * 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int chunks = (K + CHUNK - 1) / CHUNK;

  if (warp == WARPS) {  // the producer
    const int row = lane < ROWS ? weight_row<GLU>(tile, ROWS, lane, N) : -1;
    const uint32_t valid = __popc(__ballot_sync(0xFFFFFFFFu, row >= 0));
    const uint8_t* src = w + (size_t)(row < 0 ? 0 : row) * stride_w;
    for (int c = 0; c < chunks; ++c) {
      const int s = c % STAGES;
      if (c >= STAGES) bar_wait(&empty[s], ((c / STAGES) - 1) & 1);
      const int k0 = c * CHUNK;
      const uint32_t bytes = min(CHUNK, K - k0);
      if (lane == 0) bar_expect(&full[s], bytes * valid);
      __syncwarp();
      if (row >= 0) bulk_copy(ring + ((size_t)s * ROWS + lane) * CHUNK, src + k0, bytes, &full[s]);
    }
    return;
  }

  pdl_wait();  // x is the previous kernel's output
  const int r0 = warp * RW;
  bool live[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) live[r] = weight_row<GLU>(tile, ROWS, r0 + r, N) >= 0;
  float acc[RW][M];
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

  // The lane's activations of the next chunk are loaded before this chunk's products.
  uint4 xv[M][J][2];
  auto load_x = [&](int k0) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int k = k0 + 512 * j + 16 * lane;
        const uint4* p = reinterpret_cast<const uint4*>(x + (size_t)m * stride_x + k);
        xv[m][j][0] = k < K ? __ldg(p) : make_uint4(0, 0, 0, 0);
        xv[m][j][1] = k < K ? __ldg(p + 1) : make_uint4(0, 0, 0, 0);
      }
  };
  load_x(0);
  for (int c = 0; c < chunks; ++c) {
    const int s = c % STAGES, k0 = c * CHUNK;
    float xf[M][J][16];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int j = 0; j < J; ++j) {
        x8<T>(xv[m][j][0], &xf[m][j][0]);
        x8<T>(xv[m][j][1], &xf[m][j][8]);
      }
    if (c + 1 < chunks) load_x(k0 + CHUNK);
    bar_wait(&full[s], (c / STAGES) & 1);
    const uint8_t* stage = ring + ((size_t)s * ROWS + r0) * CHUNK;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      if (k0 + 512 * j + 16 * lane >= K) continue;
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        if (!live[r]) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(stage + r * CHUNK + 512 * j + 16 * lane);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float f[4];
          e4m3x4(word(v, i), f);
#pragma unroll
          for (int m = 0; m < M; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][m] = fmaf(f[e], xf[m][j][4 * i + e], acc[r][m]);
        }
      }
    }
    bar_arrive(&empty[s]);
  }

#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][m], o);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    const int row = weight_row<GLU>(tile, ROWS, r0 + r, N);
    if (row < 0) continue;
    if constexpr (GLU) {
      if (r % 2) continue;
      const int up = weight_row<GLU>(tile, ROWS, r0 + r + 1, N);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float g = MmaType<T>::to_float(MmaType<T>::from_float(acc[r][m] * scale[row]));
        const float u = MmaType<T>::to_float(MmaType<T>::from_float(acc[r + 1][m] * scale[up]));
        out[(size_t)m * stride_o + row] = MmaType<T>::from_float(silu_mul(g, u));
      }
    } else {
#pragma unroll
      for (int m = 0; m < M; ++m)
        out[(size_t)m * stride_o + row] = MmaType<T>::from_float(acc[r][m] * scale[row]);
    }
  }
}

}  // namespace bulk
}  // namespace octavo

// bulk_gemv_e4m3_<t>_m<M>_r<ROWS>_w<WARPS>_c<CHUNK>_s<STAGES>[_glu]: launched with
// (WARPS + 1) * 32 threads and STAGES * ROWS * CHUNK bytes of dynamic shared memory.
#define OCTAVO_BULK_GEMV(TN, T, M, R, W, C, S, GLU, SUFFIX)                                   \
  extern "C" __global__ void __launch_bounds__((W + 1) * 32)                                 \
      bulk_gemv_e4m3_##TN##_m##M##_r##R##_w##W##_c##C##_s##S##SUFFIX(                          \
          const T* x, int stride_x, const uint8_t* w, int stride_w, const float* scale,      \
          T* out, int stride_o, int N, int K) {                                              \
    octavo::bulk::gemv<T, M, R, W, C, S, GLU>(x, stride_x, w, stride_w, scale, out, stride_o, \
                                              N, K);                                         \
  }

#define OCTAVO_BULK_GEMV_PLAN(R, W, C, S)                                 \
  OCTAVO_BULK_GEMV(bf16, __nv_bfloat16, 1, R, W, C, S, false, )         \
  OCTAVO_BULK_GEMV(bf16, __nv_bfloat16, 2, R, W, C, S, false, )         \
  OCTAVO_BULK_GEMV(bf16, __nv_bfloat16, 1, R, W, C, S, true, _glu)      \
  OCTAVO_BULK_GEMV(bf16, __nv_bfloat16, 2, R, W, C, S, true, _glu)      \
  OCTAVO_BULK_GEMV(f16, __half, 1, R, W, C, S, false, )                 \
  OCTAVO_BULK_GEMV(f16, __half, 2, R, W, C, S, false, )                 \
  OCTAVO_BULK_GEMV(f16, __half, 1, R, W, C, S, true, _glu)              \
  OCTAVO_BULK_GEMV(f16, __half, 2, R, W, C, S, true, _glu)

// The plans built (octavo/kernels/bulk_gemv.py PLANS): rows, consumer warps, chunk bytes,
// stages.
OCTAVO_BULK_GEMV_PLAN(16, 4, 1024, 4)
OCTAVO_BULK_GEMV_PLAN(8, 2, 1024, 4)
OCTAVO_BULK_GEMV_PLAN(16, 4, 512, 6)
OCTAVO_BULK_GEMV_PLAN(32, 8, 512, 4)
OCTAVO_BULK_GEMV_PLAN(16, 4, 2048, 3)
OCTAVO_BULK_GEMV_PLAN(8, 4, 2048, 4)
OCTAVO_BULK_GEMV_PLAN(16, 8, 1024, 4)
