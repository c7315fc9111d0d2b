// Large-batch 4- and 8-bit weight-only GEMM on the swap-AB layout for Hopper (sm_90a): out^T =
// W^T x^T with the weight tile dequantized into wgmma's A registers and the activations read
// from shared memory, warp-specialized (octavo/kernels/swapab_wgmma.py has the why and the plan).
//
// CTA: 1 producer warpgroup (its 128 threads copy; setmaxnreg gives registers to the others)
// + 2 consumer warpgroups (384 threads), output columns t * 256 .. t * 256 + 255 against 128
// batch rows. 4-bit: one 64-row block t of the int16 layout (4 values a row); consumer
// warpgroup g takes values 2g and 2g + 1. 8-bit: the 64-row blocks 2t and 2t + 1 (2 values a
// row, 128 columns a block); warpgroup g takes block 2t + g, both values. Either way
// warpgroup g's outputs are columns t * 256 + 128 g + [0, 128): two m64 accumulators of 128
// batch columns. The producer copies each 64-wide K step's activations [128 x 64], packed rows
// [64 x 64] (8-bit: [128 x 64]) and
// the step's group of scales and zeros [256 each] into a ring of kStages buffers (cp.async,
// 128-byte rows swizzled in 16-byte pieces: piece j of row r at j ^ (r % 8)), signalling a
// "full" mbarrier; consumers release a buffer through its "empty" mbarrier once the MMAs
// reading it are done.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

constexpr int kRows = 64;                      // int16 rows of a layout block: wgmma's M
constexpr int kBatch = 128;                    // batch rows per CTA: wgmma's N
constexpr int kStepK = 64;                     // K per buffer: one 128-byte row
constexpr int kStages = 4;
constexpr int kConsumerWarps = 8;              // two warpgroups, after the producer's
constexpr int kThreads = kConsumerWarps * 32 + 128;
// Registers per thread after setmaxnreg: 128 x 40 + 256 x 232 fit the 64K of an SM.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
constexpr int kXBytes = kBatch * kStepK * 2;   // 16 KB
// int16 rows of the layout a CTA reads: one block of 4-bit rows, two of 8-bit rows.
template <int kBits>
constexpr int kPackedRows = kBits == 4 ? kRows : 2 * kRows;
template <int kBits>
constexpr int kPBytes = kPackedRows<kBits> * kStepK * 2;  // 8 KB (4-bit), 16 KB (8-bit)
constexpr int kSBytes = kRows * 4 * 2;         // a group's 256 scales (and as many zeros)
template <int kBits>
constexpr int kStageBytes = kXBytes + kPBytes<kBits> + 2 * kSBytes;
static_assert(kStageBytes<4> % 1024 == 0 && kStageBytes<8> % 1024 == 0,
              "every x tile 1024-aligned (the swizzle's period)");
constexpr int kProducerThreads = 128;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  // src_bytes 0: sixteen zero bytes (batch rows past M).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}

// The arrival fires when every cp.async this thread issued before it has landed.
__device__ __forceinline__ void mbar_arrive_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n"
               :: "r"(bar) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n"
               " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
               " selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  return done != 0;
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// The producer's wait for an empty buffer: one that cannot end (a fault in this kernel) traps
// after about four million polls, so the launch fails with an error instead of holding the
// GPU. (The consumers' waits have no room for the counter: with it they need more than their
// 232 registers. A fault that stalls them stalls the producer too wherever K has more steps
// than the ring has buffers.)
__device__ __forceinline__ void mbar_wait_or_trap(uint32_t bar, uint32_t parity) {
  for (uint32_t polls = 0; !mbar_try_wait(bar, parity);) {
    if (++polls == (1u << 22)) __trap();
  }
}

// wgmma's shared-memory matrix descriptor of a K-major operand in 128-byte swizzled rows
// (8 rows = 1024 bytes between row groups; the leading offset is unused in this mode).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  uint64_t desc = static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>(1) << 16;
  desc |= static_cast<uint64_t>(1024 >> 4) << 32;
  desc |= static_cast<uint64_t>(1) << 62;
  return desc;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Ties each register to this point: the compiler may not move its reads above it (the
// accumulators are written by wgmma asynchronously, until the wait before it).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(kPending) : "memory");
}

// d[64] += A (64 x 16 bf16 or fp16, this thread's four registers) x B (16 x 128, shared
// memory, the same type).
#define WGMMA_M64N128(TYPE)                                                                    \
  asm volatile(                                                                               \
      "{\n"                                                                                   \
      ".reg .pred p;\n"                                                                       \
      "setp.ne.b32 p, 1, 0;\n"                                                                \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                        \
      "{"                                                                                     \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                 \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"       \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"       \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "     \
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"                                              \
      "}\n"                                                                                   \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),     \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),             \
        "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),          \
        "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),          \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),          \
        "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),          \
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),          \
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),          \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),          \
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),          \
        "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                                  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))

// The activations' element type T (bf16 or fp16): its pair type, its rounding from float32,
// and the packed dequantization's bias (Bias | q is T's 2^e + q, exact for q < 16: bf16 128
// (7 fraction bits), fp16 1024 (10)); kByteBias: what packed_values' 8-bit pairs carry beside q.
template <typename T>
struct Act;
template <>
struct Act<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static constexpr uint32_t kBias = 0x43004300u;
  static constexpr float kBiasValue = 128.0f;
  static constexpr float kByteBias = -128.0f;
  static constexpr bool kBf16 = true;
  static __device__ __forceinline__ T2 pair(float lo, float hi) {
    return __floats2bfloat162_rn(lo, hi);
  }
  static __device__ __forceinline__ __nv_bfloat16 round(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ T2 both(__nv_bfloat16 v) { return __bfloat162bfloat162(v); }
};
template <>
struct Act<__half> {
  using T2 = __half2;
  static constexpr uint32_t kBias = 0x64006400u;
  static constexpr float kBiasValue = 1024.0f;
  static constexpr float kByteBias = 1024.0f;
  static constexpr bool kBf16 = false;
  static __device__ __forceinline__ T2 pair(float lo, float hi) { return __floats2half2_rn(lo, hi); }
  static __device__ __forceinline__ __half round(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ T2 both(__half v) { return __half2half2(v); }
};

template <typename T>
__device__ __forceinline__ void wgmma_m64n128(float (&d)[64], const uint32_t (&a)[4],
                                              uint64_t desc);
template <>
__device__ __forceinline__ void wgmma_m64n128<__nv_bfloat16>(float (&d)[64],
                                                             const uint32_t (&a)[4],
                                                             uint64_t desc) {
  WGMMA_M64N128("bf16");
}
template <>
__device__ __forceinline__ void wgmma_m64n128<__half>(float (&d)[64], const uint32_t (&a)[4],
                                                      uint64_t desc) {
  WGMMA_M64N128("f16");
}

template <typename S>
__device__ __forceinline__ float to_float(S v);
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }

// The float form. The kBits bits at bits kFrom .. of a word moved to bits 23 - kBits .. 22 (a
// float's mantissa bits of weight 1 above 2^kBits: 19 .. 22 for a nibble, 15 .. 22 for a
// byte). (Unmasked: with_bias masks.)
template <int kBits, int kFrom>
__device__ __forceinline__ uint32_t value_at(uint32_t word) {
  constexpr int kTo = 23 - kBits;
  if constexpr (kFrom <= kTo) {
    return word << (kTo - kFrom);
  } else {
    return word >> (kFrom - kTo);
  }
}

// (moved & mask) | 2^kBits's float bits in one LOP3: 0x41800000 | q << 19 is the float 16 + q,
// 0x43800000 | q << 15 the float 256 + q. The compiler splits it in two, the mask and the
// float both being immediates; here the float's bits come in a register.
template <int kBits>
__device__ __forceinline__ float with_bias(uint32_t moved, uint32_t bias) {
  constexpr uint32_t kMask = ((1u << kBits) - 1) << (23 - kBits);  // 0x00780000, 0x007F8000
  uint32_t out;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(out) : "r"(moved), "n"(kMask), "r"(bias));
  return __uint_as_float(out);
}

// Two weights of the value at bits kShift .. kShift + kBits - 1 of each int16 of a 32-bit word
// (k: low half, k + 1: high half), as (q - z) * s in float32 rounded once to T (bf16 or fp16):
// the values dequantize_swapab writes. c = -(2^kBits + z) s is exact in float32 (at most 9 by
// 11 significant bits), so fma(2^kBits + q, s, c) is (q - z) s exactly: one FFMA a weight.
template <int kBits, int kShift, typename T>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t word, float c, float s,
                                                 uint32_t bias) {
  const float lo = with_bias<kBits>(value_at<kBits, kShift>(word), bias);
  const float hi = with_bias<kBits>(value_at<kBits, 16 + kShift>(word), bias);
  typename Act<T>::T2 w = Act<T>::pair(fmaf(lo, s, c), fmaf(hi, s, c));
  return *reinterpret_cast<uint32_t*>(&w);
}

// The packed form's values: the value at bits kShift .. of both int16 halves of a word as a
// T2 pair bias + q, exact (kPackedBias below).
// 4-bit: Bias | (the nibbles at bits 0-3 of each half) is T's 2^e + q (Act<T>::kBias: bf16 128
// .. 143, fp16 1024 .. 1039, step 1), one LOP3.
// 8-bit: fp16, one PRMT puts 0x64 above each byte, 0x64qq = 1024 + q (10 fraction bits). bf16
// (8 significant bits: no bit pattern alone is 2^e + q for every byte): lo = 0x4300 | (q & 127)
// = 128 + (q & 127) and y = 0x4380 ^ (q & 128), 256 for q < 128 and 128 for q >= 128 (one LOP3
// each), then lo - y = q - 128 (one bf16x2 FMA, exact: integers of at most 8 significant
// bits).
template <int kBits, int kShift, typename T>
__device__ __forceinline__ uint32_t packed_values(uint32_t word) {
  uint32_t r;
  if constexpr (kBits == 4) {
    const uint32_t moved = kShift == 0 ? word : word >> kShift;
    asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xea;\n" : "=r"(r) : "r"(moved), "r"(Act<T>::kBias));
  } else if constexpr (!Act<T>::kBf16) {
    asm("prmt.b32 %0, %1, %2, %3;\n"
        : "=r"(r) : "r"(word), "r"(0x64646464u), "n"(kShift ? 0x4341 : 0x4240));
  } else {
    const uint32_t v = kShift == 0 ? word : word >> kShift;
    uint32_t lo, y;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(lo) : "r"(v), "n"(0x007F007F), "n"(0x43004300));
    asm("lop3.b32 %0, %1, %2, %3, 0x6a;\n" : "=r"(y) : "r"(v), "n"(0x00800080), "n"(0x43804380));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(y), "r"(0xBF80BF80u), "r"(lo));  // lo - y
  }
  return r;
}

// The packed form (kBf16Math; bf16x2 for bf16 activations, half2 for fp16): two weights as one
// T2 op chain. (bias + q) + -(bias + z) = q - z is exact in T (|q - z| <= 256), and the
// multiply by the scale rounds once: the float form's value wherever the scale is a T (other
// scales are rounded to T first, as Marlin-class kernels take them). 4-bit: three or four
// instructions a pair against seven.
template <int kBits, int kShift, typename T>
__device__ __forceinline__ uint32_t dequant_pair_packed(uint32_t word, uint32_t zb,
                                                        uint32_t sb) {
  using T2 = typename Act<T>::T2;
  uint32_t t = packed_values<kBits, kShift, T>(word);
  T2 v = __hmul2(__hadd2(*reinterpret_cast<T2*>(&t), *reinterpret_cast<T2*>(&zb)),
                 *reinterpret_cast<T2*>(&sb));
  return *reinterpret_cast<uint32_t*>(&v);
}

// One launch's operands. K splits (``splits`` > 1): CTA z covers K [z * k_per_split, ..) and
// writes float32 partials [splits, M, N]; the last CTA of a tile (a ticket in ``counters``,
// zeroed again after) adds them in split order and writes the output.
template <typename T, typename S>
struct Problem {
  const T* x;
  const int16_t* qw;
  const S* scales;
  const S* zeros;
  T* out;
  float* partial;
  int* counters;
  int m, k, n, group, stride_xm, stride_om, splits, k_per_split;
};

// The float forms' bias (with_bias): 16 + q (4-bit) or 256 + q (8-bit).
template <int kBits>
constexpr float kFloatBias = kBits == 4 ? 16.0f : 256.0f;

// The scale s and c = -(bias + z) s of (row, value) pairs from a buffer's group of scales and
// zeros (``sz``: 256 scales, then 256 zeros, the tile's columns): rows r0 / r0 + 8 of the
// layout block, values v0 / v0 + 1 (tile columns lcol0 + 64 v + r).
template <int kBits, typename S>
__device__ __forceinline__ void load_sz(const unsigned char* sz, int lcol0, float (&s)[4],
                                        float (&c)[4]) {
  const S* scales = reinterpret_cast<const S*>(sz);
  const S* zeros = reinterpret_cast<const S*>(sz + kSBytes);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = lcol0 + (i >> 1) * 64 + (i & 1) * 8;
    s[i] = to_float(scales[col]);
    c[i] = -(to_float(zeros[col]) + kFloatBias<kBits>) * s[i];
  }
}

// A scale as T: itself where it is one, else rounded from float32.
template <typename T, typename S>
__device__ __forceinline__ T to_act(S v) {
  return Act<T>::round(to_float(v));
}
template <>
__device__ __forceinline__ __nv_bfloat16 to_act<__nv_bfloat16, __nv_bfloat16>(__nv_bfloat16 v) {
  return v;
}
template <>
__device__ __forceinline__ __half to_act<__half, __half>(__half v) {
  return v;
}

// The packed forms' bias (packed_values): 2^e + q (4-bit, kBiasValue) or kByteBias + q (8-bit).
template <int kBits, typename T>
constexpr float kPackedBias = kBits == 4 ? Act<T>::kBiasValue : Act<T>::kByteBias;

// load_sz's packed form: the scale (rounded to T) and -(bias + z), each in both halves.
template <int kBits, typename T, typename S>
__device__ __forceinline__ void load_sz_packed(const unsigned char* sz, int lcol0,
                                               uint32_t (&s)[4], uint32_t (&z)[4]) {
  const S* scales = reinterpret_cast<const S*>(sz);
  const S* zeros = reinterpret_cast<const S*>(sz + kSBytes);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = lcol0 + (i >> 1) * 64 + (i & 1) * 8;
    typename Act<T>::T2 sv = Act<T>::both(to_act<T>(scales[col]));
    typename Act<T>::T2 zv =
        Act<T>::both(Act<T>::round(-(to_float(zeros[col]) + kPackedBias<kBits, T>)));
    s[i] = *reinterpret_cast<uint32_t*>(&sv);
    z[i] = *reinterpret_cast<uint32_t*>(&zv);
  }
}

// One m64 accumulator's elements: D register 4 j + e holds block row r0 + 8 (e >> 1) (output
// column col + 8 (e >> 1)) and batch column 8 j + kq + (e & 1) (row row0 + 8 j + (e & 1)).
// kPartial: to float32 partials [M, N] (one split's), else to the T output.
template <bool kPartial, typename T>
__device__ __forceinline__ void store_tile(const float (&acc)[64], T* out,
                                           float* partial, int m, int n, int row0, int col,
                                           int stride_om) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + 8 * j + (e & 1);
      if (row < m) {
        if (kPartial) {
          partial[static_cast<size_t>(row) * n + col + 8 * (e >> 1)] = acc[4 * j + e];
        } else {
          out[static_cast<size_t>(row) * stride_om + col + 8 * (e >> 1)] =
              Act<T>::round(acc[4 * j + e]);
        }
      }
    }
  }
}

// The last split's CTA: this thread's output elements of one accumulator (columns col ..) as
// the sum of every split's partial, in split order, read from L2 (other SMs wrote them) a
// split at a time, its 64 loads at once; ``sum``: the accumulator, free again once its partials
// are out.
template <typename T>
__device__ __forceinline__ void reduce_tile(float (&sum)[64], const float* partial, int splits,
                                            T* out, int m, int n, int row0, int col,
                                            int stride_om) {
  const size_t plane = static_cast<size_t>(m) * n;
#pragma unroll
  for (int i = 0; i < 64; ++i) sum[i] = 0.0f;
  for (int z = 0; z < splits; ++z) {
    // A pointer walked down the rows (8 n a j), not 64 addresses kept across splits.
    const float* p = partial + z * plane + static_cast<size_t>(row0) * n + col;
#pragma unroll
    for (int j = 0; j < 16; ++j, p += 8 * static_cast<size_t>(n)) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (row0 + 8 * j + (e & 1) < m) sum[4 * j + e] += __ldcg(p + (e & 1) * n + 8 * (e >> 1));
      }
    }
  }
  store_tile<false, T>(sum, out, nullptr, m, n, row0, col, stride_om);
}

// A consumer warpgroup's loop: warp w (of its 4) holds rows r0 = 16 w + lane / 4 and r0 + 8
// of its block and A fragment columns kq, kq + 1 and kq + 8, kq + 9 of each K16; its two values
// are output columns col0 + r and col0 + 64 + r. Warpgroup kWg: 4-bit, values 2 kWg and
// 2 kWg + 1 of the CTA's block (bits kShift = 8 kWg .. kShift + 7 of each int16); 8-bit,
// both values of the CTA's block kWg (its packed rows kRows kWg on).
// kInFlight: MMA groups left in flight while the next K16 dequantizes (1: two A register sets;
// 2: four, so a warpgroup's dequantization does not wait on its MMA of two K16s before).
template <int kBits, int kWg, bool kBf16Math, int kInFlight, typename T, typename S>
__device__ __forceinline__ void consume(const unsigned char* smem, uint32_t full0,
                                        uint32_t empty0, const Problem<T, S>& pb, int k_begin,
                                        int steps, int t, int m0, int warp, int lane,
                                        int* last) {
  constexpr int kShift = kBits == 4 ? 8 * kWg : 0;  // the first value's bits in an int16
  constexpr int kValueBits = kBits == 4 ? 4 : 8;     // the second value's, kValueBits on
  // Where the warpgroup's packed rows start in a buffer's: 128-byte rows.
  constexpr int kRowBase = kBits == 4 ? 0 : kWg * kRows * 128;
  const int r0 = 16 * (warp & 3) + (lane >> 2);
  const int kq = (lane & 3) * 2;
  const int lcol0 = 2 * kWg * kRows + r0;  // in the tile's 256 columns
  const int col0 = t * kRows * 4 + lcol0;
  // Byte offsets of this thread's words in a buffer's packed rows: 16-byte piece c of row r0
  // (piece c ^ (r0 % 8); row r0 + 8 swizzles alike, 1024 bytes on), kq's int16 in it.
  uint32_t off[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) off[c] = r0 * 128 + ((c ^ (r0 & 7)) << 4) + kq * 2;
  float acc0[64], acc1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    acc0[i] = 0.0f;
    acc1[i] = 0.0f;
  }
  float s_cur[4], c_cur[4];
  uint32_t sb_cur[4], zb_cur[4];  // the packed form's
  constexpr int kSets = kInFlight == 1 ? 2 : 4;
  static_assert(kInFlight == 1 || kInFlight == 2, "one or two MMA groups in flight");
  uint32_t a[kSets][2][4];  // [K16 % kSets][value][register]
  const uint32_t bias = kBits == 4 ? 0x41800000u : 0x43800000u;  // 2^kBits as a float
  for (int i = 0; i < steps; ++i) {
    const int st = i % kStages;
    mbar_wait(full0 + 8 * st, (i / kStages) & 1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    const uint32_t xs = smem_u32(smem) + st * kStageBytes<kBits>;
    const unsigned char* ps = smem + st * kStageBytes<kBits> + kXBytes;
    if constexpr (kBf16Math) {
      load_sz_packed<kBits, T, S>(ps + kPBytes<kBits>, lcol0, sb_cur, zb_cur);
    } else {
      load_sz<kBits, S>(ps + kPBytes<kBits>, lcol0, s_cur, c_cur);
    }
#pragma unroll
    for (int kk = 0; kk < kStepK / 16; ++kk) {
      uint32_t (&ak)[2][4] = a[kk % kSets];
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // a0: (r0, kq), a1: (r0 + 8, kq), a2: (r0, kq + 8), a3
        // Row r0 + 8 (q & 1), K16 column kq + 8 (q >> 1): piece 2 kk + (q >> 1).
        const uint32_t word = *reinterpret_cast<const uint32_t*>(
            ps + kRowBase + off[2 * kk + (q >> 1)] + (q & 1) * 1024);
        const int i_row = q & 1;  // s / c index: (row, value) = i_row + 2 value
        if constexpr (kBf16Math) {
          ak[0][q] = dequant_pair_packed<kBits, kShift, T>(word, zb_cur[i_row], sb_cur[i_row]);
          ak[1][q] = dequant_pair_packed<kBits, kShift + kValueBits, T>(
              word, zb_cur[2 + i_row], sb_cur[2 + i_row]);
        } else {
          ak[0][q] = dequant_pair<kBits, kShift, T>(word, c_cur[i_row], s_cur[i_row], bias);
          ak[1][q] = dequant_pair<kBits, kShift + kValueBits, T>(word, c_cur[2 + i_row],
                                                                 s_cur[2 + i_row], bias);
        }
      }
      wgmma_fence();
      const uint64_t desc = smem_desc(xs + kk * 32);
      wgmma_m64n128<T>(acc0, ak[0], desc);
      wgmma_m64n128<T>(acc1, ak[1], desc);
      wgmma_commit();
      // At most kInFlight groups in flight: the set the next K16 writes is free again (its
      // MMA was kSets K16s back), and at kk = kInFlight - 1 the previous buffer's last MMAs
      // are done.
      wgmma_wait<kInFlight>();
      if (kk == kInFlight - 1 && i > 0 && lane == 0) {
        mbar_arrive(empty0 + 8 * ((i - 1) % kStages));
      }
    }
  }
  wgmma_wait<0>();
  fence_regs(acc0);  // no read of an accumulator may move above the wait
  fence_regs(acc1);
  if (pb.splits == 1) {
    store_tile<false, T>(acc0, pb.out, nullptr, pb.m, pb.n, m0 + kq, col0, pb.stride_om);
    store_tile<false, T>(acc1, pb.out, nullptr, pb.m, pb.n, m0 + kq, col0 + kRows,
                         pb.stride_om);
    return;
  }
  float* mine = pb.partial + static_cast<size_t>(blockIdx.z) * pb.m * pb.n;
  store_tile<true, T>(acc0, nullptr, mine, pb.m, pb.n, m0 + kq, col0, 0);
  store_tile<true, T>(acc1, nullptr, mine, pb.m, pb.n, m0 + kq, col0 + kRows, 0);
  // No counters: a second launch sums the partials over every SM (split_sum.sum_splits).
  if (pb.counters == nullptr) return;
  // Every consumer thread's partials are out before the ticket (the producer warpgroup has
  // left: a named barrier over the 256 consumer threads).
  __threadfence();
  asm volatile("bar.sync 1, %0;\n" :: "n"(kConsumerWarps * 32) : "memory");
  const int tile = blockIdx.y * gridDim.x + blockIdx.x;
  if (warp == 4 && lane == 0) *last = atomicAdd(pb.counters + tile, 1) == pb.splits - 1;
  asm volatile("bar.sync 1, %0;\n" :: "n"(kConsumerWarps * 32) : "memory");
  if (!*last) return;
  __threadfence();
  reduce_tile(acc0, pb.partial, pb.splits, pb.out, pb.m, pb.n, m0 + kq, col0, pb.stride_om);
  reduce_tile(acc1, pb.partial, pb.splits, pb.out, pb.m, pb.n, m0 + kq, col0 + kRows,
              pb.stride_om);
  if (warp == 4 && lane == 0) pb.counters[tile] = 0;  // zeroed for the next call (graphs)
}

template <int kBits, bool kBf16Math, int kInFlight, typename T, typename S>
__device__ __forceinline__ void swapab_wgmma_body(const Problem<T, S>& pb) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ int last;  // K splits: whether this CTA finishes its tile (both warpgroups read it)
  // The ring 1024-aligned (the swizzle's period), then the barriers.
  // (An offset into the shared array, not integer arithmetic on its address, so the compiler
  // keeps knowing the loads through it are shared-memory loads.)
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes<kBits>);
  const uint32_t ring = smem_u32(smem);
  const uint32_t full0 = smem_u32(bars);
  const uint32_t empty0 = smem_u32(bars + kStages);

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x;             // 256 output columns: kPackedRows rows of the layout
  const int m0 = blockIdx.y * kBatch;   // first batch row
  const int k_begin = blockIdx.z * pb.k_per_split;
  const int k_end = min(pb.k, k_begin + pb.k_per_split);
  const int steps = (k_end - k_begin) / kStepK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, kProducerThreads);  // the producer's threads
      mbar_init(empty0 + 8 * s, kConsumerWarps);   // one lane per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp < 4) {  // the producer warpgroup: its registers to the consumers
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(kProducerRegs));
    // Thread p copies piece pj = p % 8 of rows pr + 16 u (pr = p / 8) of the activations (u <
    // 8) and of the packed rows (u < kPackedRows / 16: 4, or 8 at 8 bits): every row's piece j
    // lands at j ^ (pr % 8), 2048 bytes a u apart. Addresses are set up once; a step adds its
    // K offset. (One warp computing every copy's address, session 54's first form, took ~4x
    // the MMAs' time a step.)
    const int p = threadIdx.x;
    const int pr = p >> 3, pj = p & 7;
    const uint32_t dst = pr * 128 + ((pj ^ (pr & 7)) << 4);
    // Batch rows m0 + pr + 16 u past M read zeros (from row M - 1's address).
    const int x_rows = max(0, min(8, (pb.m - m0 - pr + 15) / 16));
    const T* x_src =
        pb.x + static_cast<size_t>(min(m0 + pr, pb.m - 1)) * pb.stride_xm + k_begin + pj * 8;
    const T* x_last =
        pb.x + static_cast<size_t>(pb.m - 1) * pb.stride_xm + k_begin + pj * 8;
    const size_t x_step = static_cast<size_t>(16) * pb.stride_xm;
    const int16_t* q_src =
        pb.qw + static_cast<size_t>(t * kPackedRows<kBits> + pr) * pb.k + k_begin + pj * 8;
    const size_t q_step = static_cast<size_t>(16) * pb.k;
    // Threads 0-31 copy the step's group of scales (32 pieces of the tile's 256), 32-63 zeros.
    const S* sz_src = (p < 32 ? pb.scales : pb.zeros) + t * kRows * 4 + (p & 31) * 8;
    for (int i = 0; i < steps; ++i) {
      const int st = i % kStages;
      if (i >= kStages) mbar_wait_or_trap(empty0 + 8 * st, ((i / kStages) - 1) & 1);
      const uint32_t xs = ring + st * kStageBytes<kBits>;
      const int koff = i * kStepK;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const bool in = u < x_rows;
        cp_async16(xs + dst + u * 2048, (in ? x_src + u * x_step : x_last) + koff, in ? 16 : 0);
      }
#pragma unroll
      for (int u = 0; u < kPackedRows<kBits> / 16; ++u) {
        cp_async16(xs + kXBytes + dst + u * 2048, q_src + u * q_step + koff, 16);
      }
      if (p < 64) {
        const int g = (k_begin + koff) / pb.group;
        cp_async16(xs + kXBytes + kPBytes<kBits> + (p >> 5) * kSBytes + (p & 31) * 16,
                   sz_src + static_cast<size_t>(g) * pb.n, 16);
      }
      mbar_arrive_copies(full0 + 8 * st);
    }
    // Its copies land (and their arrivals fire) before the thread exits: what becomes of an
    // exited thread's pending cp.async is not defined.
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // Consumers: warpgroup g takes output columns t * 256 + 128 g + [0, 128) (4-bit: values 2g
  // and 2g + 1, bits 8g .. 8g + 7 of each int16; 8-bit: block 2t + g).
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(kConsumerRegs));
  if (warp < 8) {
    consume<kBits, 0, kBf16Math, kInFlight, T, S>(smem, full0, empty0, pb, k_begin, steps, t, m0, warp, lane, &last);
  } else {
    consume<kBits, 1, kBf16Math, kInFlight, T, S>(smem, full0, empty0, pb, k_begin, steps, t, m0, warp, lane, &last);
  }
}

}  // namespace

// Grid (N / 256 output columns, ceil(M / 128), K splits), 384 threads, dynamic shared memory
// kStages * 25 KB (8-bit: 33 KB) + 1024 (alignment) + the barriers; x, qw, scales and zeros
// 16-byte aligned. K, the group and k_per_split multiples of 64; with splits > 1, ``partial``
// float32 [splits, M, N] and ``counters`` one zeroed int per (x, y) tile, or null: the
// partials only, for a second launch to sum. T: the activations' and the output's type; S: the
// scales' and zeros'.
#define SWAPAB_WGMMA_ENTRY(NAME, BITS, T, S, BF16_MATH, IN_FLIGHT)                           \
  extern "C" __global__ void __launch_bounds__(kThreads, 1)                                 \
  NAME(const T* x, const int16_t* qw, const S* scales, const S* zeros, T* out,             \
       float* partial, int* counters, int m, int k, int n, int group, int stride_xm,        \
       int stride_om, int splits, int k_per_split) {                                         \
    const Problem<T, S> pb{x,     qw, scales, zeros,     out,       partial,   counters, m,  \
                           k,     n,  group,  stride_xm, stride_om, splits,    k_per_split};  \
    swapab_wgmma_body<BITS, BF16_MATH, IN_FLIGHT>(pb);                                       \
  }

// Every form of one (bits, activations, scales) triple: float or packed (PACKED: the name's
// suffix) dequantization, one or two MMA groups in flight ("_deep").
#define SWAPAB_WGMMA_FORMS(PREFIX, PACKED, BITS, T, S)           \
  SWAPAB_WGMMA_ENTRY(PREFIX, BITS, T, S, false, 1)               \
  SWAPAB_WGMMA_ENTRY(PREFIX##PACKED, BITS, T, S, true, 1)        \
  SWAPAB_WGMMA_ENTRY(PREFIX##_deep, BITS, T, S, false, 2)        \
  SWAPAB_WGMMA_ENTRY(PREFIX##PACKED##_deep, BITS, T, S, true, 2)

SWAPAB_WGMMA_FORMS(swapab_wgmma_bf16_scales, _bf16_math, 4, __nv_bfloat16, __nv_bfloat16)
SWAPAB_WGMMA_FORMS(swapab_wgmma_f16_scales, _bf16_math, 4, __nv_bfloat16, __half)
// fp16 activations (float16 checkpoints: AutoAWQ's and AutoGPTQ's), with fp16 scales.
SWAPAB_WGMMA_FORMS(swapab_wgmma_f16_act, _half_math, 4, __half, __half)
// 8-bit weights (GPTQ 8-bit, compressed-tensors W8A16), the same forms.
SWAPAB_WGMMA_FORMS(swapab_wgmma8_bf16_scales, _bf16_math, 8, __nv_bfloat16, __nv_bfloat16)
SWAPAB_WGMMA_FORMS(swapab_wgmma8_f16_scales, _bf16_math, 8, __nv_bfloat16, __half)
SWAPAB_WGMMA_FORMS(swapab_wgmma8_f16_act, _half_math, 8, __half, __half)
