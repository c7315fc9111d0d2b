// What the decode GEMMs on mma.sync share (swapab_mma.cu, dense_mma.cu): the m16n8k16
// product for bf16 / fp16, a uint4's 32-bit words, the PDL wait and the split-K ticket.
// cuda_module.build hashes this header with every source, so a change rebuilds them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace octavo {

// The 16-bit operand type's operations (bf16 or fp16).
template <typename T>
struct MmaType {
  static constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  // One m16n8k16 tensor-core product with float accumulators.
  static __device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1,
                                             uint32_t a2, uint32_t a3, uint32_t b0,
                                             uint32_t b1) {
    if constexpr (kBf16)
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
          "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
          "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ T from_float(float v) {
    if constexpr (kBf16)
      return __float2bfloat16_rn(v);
    else
      return __float2half_rn(v);
  }
  static __device__ __forceinline__ float to_float(T v) {
    if constexpr (kBf16)
      return __bfloat162float(v);
    else
      return __half2float(v);
  }
  // v rounded to T (nearest even), as a float.
  static __device__ __forceinline__ float round(float v) { return to_float(from_float(v)); }
};

constexpr int kMaxWarps = 8;  // per CTA: cta_sum's shared buffer

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// Programmatic dependent launch: let the next kernel's blocks be placed, then wait for the
// previous kernel (a no-op for a launch without the attribute). Nothing another kernel of
// the step writes is read, and nothing is written, before this.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Activations for the B operand: row mt * 8 + g's 16 * XV bytes at k + 32 XV i + 8 XV t for
// each batch tile mt and step i, as XV uint4 (zeros past M), rows stride_x values apart and
// 16-byte aligned. (XV = 2: the steps of weights of one byte, 64 K values wide.)
template <int XV = 1, typename T, int MT, int SV>
__device__ __forceinline__ void load_x(uint4 (&nx)[MT][SV], const T* __restrict__ x, int M,
                                       int stride_x, int k, int g, int t) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int m = mt * 8 + g;
#pragma unroll
    for (int i = 0; i < SV; ++i)
      nx[mt][i] = m < M ? *reinterpret_cast<const uint4*>(
                              x + (size_t)m * stride_x + k + 32 * XV * (i / XV) + 8 * XV * t +
                              8 * (i % XV))
                        : make_uint4(0, 0, 0, 0);
  }
}

// The CTA's warps hold K ranges of the same tile: add the lanes' accumulators acc[mt][c][i]
// (c < C of D: those holding outputs) up in warp 0 through shared memory at ``red``
// ([warps - 1][MT * D * 4][32] floats). False in the other warps, which are then done.
template <int C, int MT, int D>
__device__ __forceinline__ bool cta_sum_at(float* red, float (&acc)[MT][D][4], int warp,
                                           int warps, int lane) {
  constexpr int R = MT * D * 4;
  auto each_acc = [&](auto fn) {  // fn(accumulator, its row in red)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) fn(acc[mt][c][i], (mt * D + c) * 4 + i);
  };
  if (warps > 1) {
    if (warp > 0) each_acc([&](float& a, int r) { red[((warp - 1) * R + r) * 32 + lane] = a; });
    __syncthreads();
    if (warp > 0) return false;
    for (int v = 0; v < warps - 1; ++v)
      each_acc([&](float& a, int r) { a += red[(v * R + r) * 32 + lane]; });
  }
  return true;
}

// cta_sum_at in a static shared buffer of its own.
template <int C, int MT, int D>
__device__ __forceinline__ bool cta_sum(float (&acc)[MT][D][4], int warp, int warps, int lane) {
  __shared__ float red[kMaxWarps - 1][MT * D * 4][32];
  return cta_sum_at<C>(&red[0][0][0], acc, warp, warps, lane);
}

// cp.async: 16 bytes from global to shared memory without passing through registers (zeros
// where ``fill`` is false: nothing is read then), in the calling thread's current group;
// commit closes the group, wait<N> returns once at most N of the thread's groups are pending
// (their bytes then visible to the thread; to the warp after a __syncwarp).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool fill = true) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(d), "l"(src), "r"(fill ? 16 : 0) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// fn(mt, i, m) for each accumulator register i of each batch tile mt whose batch row
// m = mt * 8 + 2t + (i & 1) (the mma's C fragment) is below M.
template <int MT, typename F>
__device__ __forceinline__ void each_row(int t, int M, F&& fn) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = mt * 8 + 2 * t + (i & 1);
      if (m < M) fn(mt, i, m);
    }
  }
}

// silu(gate) * up in float32, as activation.py's silu_mul (the gated MLP's activation in a
// GEMM's store).
__device__ __forceinline__ float silu_mul(float gate, float up) {
  return gate / (1.0f + __expf(-gate)) * up;
}

// Split over CTAs, called by the warp that stored this CTA's partials: whether it took the
// tile's last ticket (then it adds the partials in split order, deterministic, writes the
// output and calls release_tile). The warp's barrier orders its partial stores before lane
// 0's release (acq_rel: no full fence), and lane 0's acquire before the warp's reads.
__device__ __forceinline__ bool last_ticket(int* cnt, int splits, int lane) {
  __syncwarp();
  int last = 0;
  if (lane == 0) {
    int ticket;
    asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(ticket) : "l"(cnt) : "memory");
    last = ticket == splits - 1;
  }
  last = __shfl_sync(0xffffffffu, last, 0);
  if (last) __syncwarp();
  return last;
}

// The counter zeroed for the next call (read by it, after this kernel).
__device__ __forceinline__ void release_tile(int* cnt, int lane) {
  if (lane == 0) atomicExch(cnt, 0);
}

}  // namespace octavo
