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
};

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
