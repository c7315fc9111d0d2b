// AVX-512 helpers for the decode attention (compiled only where -march=native has AVX-512F).
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include "common.h"

namespace octavo_cpu {
namespace simd512 {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load16(const bf16* p) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Lane i of the result = sum of the 16 lanes of v[i]: a transpose-and-add tree (4 levels of
// shuffles and adds) instead of 16 separate horizontal sums.
inline __m512 reduce16(const __m512* v) {
  __m512 w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i) {  // 128-bit lanes: [a0+a2, a1+a3, b0+b2, b1+b3]
    __m512 lo = _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0));
    __m512 hi = _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2));
    w[i] = _mm512_add_ps(lo, hi);
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit lane k: 4 partial sums of v[4i + k]
    __m512 even = _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0));
    __m512 odd = _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1));
    x[i] = _mm512_add_ps(even, odd);
  }
  for (int i = 0; i < 2; ++i) {  // per 128-bit lane: [P0+P2, Q0+Q2, P1+P3, Q1+Q3]
    y[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                         _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
  }
  __m512d a = _mm512_castps_pd(y[0]), b = _mm512_castps_pd(y[1]);
  __m512 s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  // s[4k + m] holds the sum of v[4m + k]: transpose the 4x4 index back.
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(idx, s);
}

}  // namespace simd512
}  // namespace octavo_cpu
#endif
