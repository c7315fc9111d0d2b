// Shared by the quantized linear kernels (quant_gemm.cpp) and the VNNI kernel on weights
// interleaved by 16 rows (quant_gemm_vnni16.cpp): quantized activations and the weights' view.
#pragma once

#include <memory>
#include <vector>

#include "common.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define OCTAVO_QUANT_VNNI 1
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define OCTAVO_QUANT_AVX2X16 1
#endif

namespace octavo_cpu {
namespace quant {

constexpr int64_t kBlock = 32;  // activation values per int16 scale

// Activations quantized per 32-block: q [M, K] int16, d [M, K/32], and s [M, K/G], the exact
// float sum of x over each weight group (for the m-terms).
// Uninitialised scratch (std::vector would zero-fill what the quantizer overwrites anyway).
template <typename T>
struct Scratch {
  std::unique_ptr<T[]> p;
  void resize(int64_t n) { p.reset(new T[n]); }
  T* data() { return p.get(); }
  const T* data() const { return p.get(); }
  T& operator[](int64_t i) { return p[i]; }
  const T& operator[](int64_t i) const { return p[i]; }
};

struct QuantActs {
  Scratch<int16_t> q;
  Scratch<int8_t> hi, lo;  // q = 256 hi + lo, filled for the VNNI and AVX2 grouped kernels
  Scratch<float> d, s;
  int64_t k, nb, ng;
};

// Pair order of q (for the AVX2 kernel's 8-bit weights): inputs 4j, 4j+2, 4j+1, 4j+3 of every
// 4, so each broadcast dword is the pair one vpmaddwd lane multiplies.

// Scales and mins are float32, or float16 where the file's values are exactly float16 (Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0: their d and m are the file's own fp16): 5 bits per weight of a 4-bit
// format instead of 6, the bytes llama.cpp reads.
//
// Layouts: row-major (qweight [N, row_bytes], scales [N, K/G]), or interleaved by 16 rows
// (qweight [N/16, row_bytes/4, 64]: each 64 bytes are one 4-byte run of each of 16 rows, so
// lane r of a vpdpbusd is row r's dot over 4 inputs; scales [N/16, K/G, 16]): the VNNI path
// then makes 16 outputs per pass with the activations broadcast, about a third of the
// instructions of the row-major kernel per weight. Other paths read interleaved weights
// through a de-interleaved copy of each row.
constexpr int64_t kRows = 16;

// Interleaved weights may be stored tighter than their rows read: 5 and 6 bits a weight as the
// 4-bit nibbles plus one or two planes of high bits (Q5_0 / Q5_1 / Q5_K, Q6_K: the file's own
// bits a weight instead of a byte), and without mins where the format's m is -2^(bits-1) d
// (Q4_0, Q5_0, Q8_0, Q6_K: an empty mins tensor). Per 64-input chunk of a 16-row group, the
// 8 nibble runs (512 bytes) are followed by 2 H vectors of 64 bytes holding the high bits
// (H = bits - 4): byte 4 r + b of vector t (row r, byte b, as in a run) holds, in bits
// H v ... H v + H - 1, the high bits of slot v = 2 (j - t 4/H) + which of runs
// j = t 4/H ... t 4/H + 4/H - 1 (which: 0 the low nibbles' vector, 1 the high ones'), so one
// shift and one vpternlog move a vector's high bits to bits 4.. in the register.
//
// K-quants (Q4_K, Q5_K, Q6_K) interleaved keep their scales in two levels, as the file does:
// ``scales`` uint8 (Q4_K / Q5_K's 6-bit scales) or int8 (Q6_K's) [N/16, ng + 4 K/256, 16], per
// 16-row group first the ng integer scales of each row, then K/256 x 16 float16 super-block
// d, then (uint8 only) K/256 x 16 float16 dmin; ``mins`` uint8 [N/16, ng, 16] (the 6-bit mins:
// m = -dmin min6) or empty (Q6_K: m = -32 d). d = d_super * scale is exact in float32 (11 and
// 8 significant bits), the value the float32 layout held, at 1 byte per group instead of 4.
struct Weights {
  const uint8_t* q;
  const void* d;
  const void* m;  // null: m = -2^(store_bits-1) d (implicit_m)
  bool half;
  bool inter;  // interleaved by kRows rows
  int64_t bits;  // of a row as row_q gives it: 4 (packed nibbles) or 8 (a byte a weight)
  int64_t k, nb, group, ng, row_bytes;
  int64_t store_bits;  // as stored: 4, 5, 6 or 8 (5 and 6 only interleaved)
  bool implicit_m;
  int64_t two_level;  // 0: float scales; 1: uint8 scales (+ mins); 2: int8 scales (no mins)
  int64_t sstride;  // two-level: scale bytes per 16-row group
  int64_t sup_shift;  // two-level: log2 of the groups per 256-input super-block (3 or 4)

  // Float16 super-block values of a 16-row group (two-level): which 0 d_super, 1 dmin.
  const c10::Half* super16(int64_t grp, int64_t g, int which) const {
    const int64_t nsup = k >> 8, s = g >> sup_shift;  // (no division: a call per group)
    return reinterpret_cast<const c10::Half*>(static_cast<const uint8_t*>(d) + grp * sstride +
                                              ng * kRows) + (which * nsup + s) * kRows;
  }
  // Row r's d and (stored) m of group g, 16-row group grp (two-level).
  float two_level_d(int64_t grp, int64_t g, int64_t r) const {
    const uint8_t* sub = static_cast<const uint8_t*>(d) + grp * sstride + g * kRows + r;
    const float sc = two_level == 1 ? static_cast<float>(*sub)
                                    : static_cast<float>(*reinterpret_cast<const int8_t*>(sub));
    return static_cast<float>(super16(grp, g, 0)[r]) * sc;
  }
  float two_level_m(int64_t grp, int64_t g, int64_t r) const {
    const uint8_t mn = static_cast<const uint8_t*>(m)[(grp * ng + g) * kRows + r];
    return -static_cast<float>(super16(grp, g, 1)[r]) * static_cast<float>(mn);
  }

  // Bytes of one 64-input chunk of a 16-row group in the nibble layouts (4, 5, 6 bits).
  int64_t chunk_bytes() const { return 512 + 128 * (store_bits - 4); }
  float min_factor() const { return -static_cast<float>(int64_t{1} << (store_bits - 1)); }
};

#if defined(OCTAVO_QUANT_VNNI)
// out [m, n] (row stride n) = activations times interleaved weights (w.inter), 16 rows a pass.
void linear_groups_vnni(const Weights& w, const QuantActs& a, int64_t m, int64_t n, float* op);
#endif
#if defined(OCTAVO_QUANT_AVX2X16)
// The same on AVX2 (quant_gemm_avx2x16.cpp): activations in pair order.
void linear_groups_avx2(const Weights& w, const QuantActs& a, int64_t m, int64_t n, float* op);
#endif

}  // namespace quant
}  // namespace octavo_cpu
