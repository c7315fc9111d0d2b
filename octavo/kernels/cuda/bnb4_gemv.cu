// bitsandbytes 4-bit weights (NF4 / FP4) times one to four rows of activations, on CUDA cores,
// the 16 code values looked up in shared memory: octavo/kernels/bnb4_cuda.py.
//
// Weights: uint8 [N, K / 2] (rows `ldq` bytes apart, 16-byte aligned), byte j of a row holding
// weights 2j (high nibble) and 2j + 1 (low nibble); a float32 absmax per `bs` consecutive
// weights of a row ([N, K / bs], rows `lda` floats apart); the 16 float32 code values.
// W[n, k] = code[nibble(n, k)] * absmax[n, k / bs].
//
// Grid (ceil(N / rows_per_cta), ceil(K / 1024)), WARPS warps a block. A block covers 1,024
// weights of K (its chunk; K a multiple of 32, the last chunk's lanes past K idle): lane l of
// every warp always takes the chunk's weights 32 l .. 32 l + 31,
// so it converts its 32 activations (per row of x) to float32 once, into registers, and keeps
// them for every weight row it visits; warp w visits rows w, w + WARPS, ... of the block's
// rows, AHEAD of them at a time (their loads issued together). A row's visit is one 16-byte
// load a lane (the warp reads 512 contiguous bytes), 32
// code lookups (shared memory: 16 words in 16 banks, so a warp's lookups never conflict) and
// 32 FMAs a row of x, the lane's sum times its block's absmax (32 weights lie in one block:
// bs a multiple of 32), summed over the warp by shuffles; lane 0 adds it to `out` (float32
// [MR, N], zeroed by the caller) with an atomic, one per chunk. The chunks add in an
// order the hardware picks: float32 sums, not bit-reproducible across runs.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T, int MR, int WARPS, int AHEAD>
__device__ __forceinline__ void bnb4_gemv(const uint8_t* __restrict__ q,
                                          const float* __restrict__ absmax,
                                          const float* __restrict__ code,
                                          const T* __restrict__ x, float* __restrict__ out,
                                          int n, int k, int ldq, int lda, int ldx, int bs,
                                          int rows_per_cta) {
  __shared__ float table[16];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (threadIdx.x < 16) table[threadIdx.x] = code[threadIdx.x];
  const int k0 = blockIdx.y * 1024 + lane * 32;  // this lane's first weight
  const bool active = k0 < k;                      // K is a multiple of 32
  float xr[MR][32];
#pragma unroll
  for (int m = 0; m < MR; ++m) {
    const uint4* xv = reinterpret_cast<const uint4*>(x + (size_t)m * ldx + (active ? k0 : 0));
#pragma unroll
    for (int v = 0; v < 4; ++v) {  // 4 x 16 bytes = 32 activations (zeros past K)
      uint4 raw = active ? xv[v] : make_uint4(0, 0, 0, 0);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < 8; ++j) xr[m][v * 8 + j] = to_float(e[j]);
    }
  }
  __syncthreads();
  const int row0 = blockIdx.x * rows_per_cta;
  const int row_end = min(n, row0 + rows_per_cta);
  for (int r0 = row0 + warp; r0 < row_end; r0 += WARPS * AHEAD) {
    // AHEAD rows' bytes and scales loaded before any arithmetic: AHEAD x 512 bytes a warp in
    // flight (one row's loads alone left a 4-row launch, 168 registers a lane and so one
    // block an SM, short of bytes in flight).
    uint4 w[AHEAD];
    float a[AHEAD];
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {
      const int r = r0 + u * WARPS;
      const bool ok = active && r < row_end;
      w[u] = ok ? *reinterpret_cast<const uint4*>(q + (size_t)r * ldq + k0 / 2)
                : make_uint4(0, 0, 0, 0);
      a[u] = ok ? absmax[(size_t)r * lda + k0 / bs] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {
      const int r = r0 + u * WARPS;
      if (r >= row_end) break;  // the same for the whole warp
      const uint32_t words[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
      float s[MR];
#pragma unroll
      for (int m = 0; m < MR; ++m) s[m] = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int b = 0; b < 4; ++b) {  // byte b of word i: weights 8i + 2b (high), + 1 (low)
          const float hi = table[(words[i] >> (8 * b + 4)) & 0xF];
          const float lo = table[(words[i] >> (8 * b)) & 0xF];
#pragma unroll
          for (int m = 0; m < MR; ++m) {
            s[m] = fmaf(hi, xr[m][8 * i + 2 * b], s[m]);
            s[m] = fmaf(lo, xr[m][8 * i + 2 * b + 1], s[m]);
          }
        }
      }
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        float v = s[m] * a[u];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) atomicAdd(out + (size_t)m * n + r, v);
      }
    }
  }
}

}  // namespace

#define OCTAVO_BNB4_GEMV(TNAME, T, MR, AHEAD)                                                 \
  extern "C" __global__ void __launch_bounds__(256)                                           \
      bnb4_gemv_##TNAME##_m##MR##_a##AHEAD(const uint8_t* q, const float* absmax,             \
                                           const float* code, const T* x, float* out, int n,  \
                                           int k, int ldq, int lda, int ldx, int bs,          \
                                           int rows_per_cta) {                                \
    bnb4_gemv<T, MR, 8, AHEAD>(q, absmax, code, x, out, n, k, ldq, lda, ldx, bs,             \
                               rows_per_cta);                                                 \
  }

#define OCTAVO_BNB4_GEMV_ROWS(TNAME, T, AHEAD) \
  OCTAVO_BNB4_GEMV(TNAME, T, 1, AHEAD)         \
  OCTAVO_BNB4_GEMV(TNAME, T, 2, AHEAD)         \
  OCTAVO_BNB4_GEMV(TNAME, T, 3, AHEAD)         \
  OCTAVO_BNB4_GEMV(TNAME, T, 4, AHEAD)

OCTAVO_BNB4_GEMV_ROWS(bf16, __nv_bfloat16, 1)
OCTAVO_BNB4_GEMV_ROWS(bf16, __nv_bfloat16, 8)
OCTAVO_BNB4_GEMV_ROWS(f16, __half, 1)
OCTAVO_BNB4_GEMV_ROWS(f16, __half, 8)
