// Inner loops of the decode attention, on chunks of at most 16 context tokens of one KV head:
// scores of its g query heads, and their probability-weighted sum of V rows. `rows` holds each
// token's element offset into the head's cache; scores are laid out [g, n] (row stride n).
#pragma once

#include <algorithm>

#include "common.h"
#include "simd512.h"

namespace octavo_cpu {

constexpr int64_t kChunk = 16;

// Portable versions (any head dim): loops g++ vectorises on its own.
template <typename T>
void chunk_scores_generic(const float* qf, const T* k, const int64_t* rows, int64_t cnt,
                          int64_t g, int64_t d, float* s, int64_t n) {
  constexpr int W = 16;
  for (int64_t i = 0; i < cnt; ++i) {
    const T* kr = k + rows[i];
    for (int64_t j = 0; j < g; ++j) {
      const float* q = qf + j * d;
      float acc[W] = {0.0f};
      int64_t c = 0;
      for (; c + W <= d; c += W) {
        for (int l = 0; l < W; ++l) acc[l] += q[c + l] * to_f(kr[c + l]);
      }
      float dot = 0.0f;
      for (; c < d; ++c) dot += q[c] * to_f(kr[c]);
      for (int l = 0; l < W; ++l) dot += acc[l];
      s[j * n + i] = dot;
    }
  }
}

template <typename T>
void chunk_values_generic(const float* p, const T* v, const int64_t* rows, int64_t cnt,
                          int64_t g, int64_t d, int64_t n, float* acc) {
  for (int64_t i = 0; i < cnt; ++i) {
    const T* vr = v + rows[i];
    for (int64_t j = 0; j < g; ++j) {
      const float w = p[j * n + i];
      float* a = acc + j * d;
      for (int64_t c = 0; c < d; ++c) a[c] += w * to_f(vr[c]);
    }
  }
}

#if defined(__AVX512F__)
// AVX-512 versions for head dims that are multiples of 16: NC = d / 16 chunks of a row (0:
// known at runtime only). Query heads go in blocks of GB whose q rows (scores) or accumulators
// (values) stay in registers, so each K/V row is loaded once per block instead of per head.
template <int NC>
constexpr int heads_per_block() {
  return NC > 0 && NC <= 8 ? 16 / NC : 1;
}

template <typename T, int NC>
void chunk_scores_512(const float* qf, const T* k, const int64_t* rows, int64_t cnt, int64_t g,
                      int64_t d, float* s, int64_t n) {
  using namespace simd512;
  constexpr int GB = heads_per_block<NC>();
  constexpr int kMax = NC > 0 ? NC : 16;
  const int64_t nc = NC > 0 ? NC : d / 16;
  const __mmask16 mask = static_cast<__mmask16>((1u << cnt) - 1u);
  __m512 part[GB][16];
  for (int64_t j0 = 0; j0 < g; j0 += GB) {
    const int64_t gb = std::min<int64_t>(GB, g - j0);
    for (int64_t i = 0; i < 16; ++i) {
      if (i >= cnt) {
        for (int jj = 0; jj < GB; ++jj) part[jj][i] = _mm512_setzero_ps();
        continue;
      }
      const T* kr = k + rows[i];
      __m512 kv[kMax];
      for (int64_t c = 0; c < nc; ++c) kv[c] = load16(kr + 16 * c);
      for (int jj = 0; jj < GB; ++jj) {
        if (jj >= gb) break;
        const float* q = qf + (j0 + jj) * d;
        __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), kv[0]);
        for (int64_t c = 1; c < nc; ++c) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), kv[c], acc);
        part[jj][i] = acc;
      }
    }
    for (int jj = 0; jj < GB; ++jj) {
      if (jj >= gb) break;
      _mm512_mask_storeu_ps(s + (j0 + jj) * n, mask, reduce16(part[jj]));
    }
  }
}

template <typename T, int NC>
void chunk_values_512(const float* p, const T* v, const int64_t* rows, int64_t cnt, int64_t g,
                      int64_t d, int64_t n, float* acc) {
  using namespace simd512;
  constexpr int GB = heads_per_block<NC>();
  constexpr int kMax = NC > 0 ? NC : 16;
  const int64_t nc = NC > 0 ? NC : d / 16;
  for (int64_t j0 = 0; j0 < g; j0 += GB) {
    const int64_t gb = std::min<int64_t>(GB, g - j0);
    __m512 a[GB][kMax];
    for (int jj = 0; jj < GB; ++jj) {
      if (jj >= gb) break;
      for (int64_t c = 0; c < nc; ++c) a[jj][c] = _mm512_loadu_ps(acc + (j0 + jj) * d + 16 * c);
    }
    for (int64_t i = 0; i < cnt; ++i) {
      const T* vr = v + rows[i];
      __m512 vv[kMax];
      for (int64_t c = 0; c < nc; ++c) vv[c] = load16(vr + 16 * c);
      for (int jj = 0; jj < GB; ++jj) {
        if (jj >= gb) break;
        const __m512 w = _mm512_set1_ps(p[(j0 + jj) * n + i]);
        for (int64_t c = 0; c < nc; ++c) a[jj][c] = _mm512_fmadd_ps(w, vv[c], a[jj][c]);
      }
    }
    for (int jj = 0; jj < GB; ++jj) {
      if (jj >= gb) break;
      for (int64_t c = 0; c < nc; ++c) _mm512_storeu_ps(acc + (j0 + jj) * d + 16 * c, a[jj][c]);
    }
  }
}
#endif

// Picks the AVX-512 loops where they apply (NC > 0: d / 16 known at compile time).
template <typename T, int NC>
struct Chunks {
  static bool simd(int64_t d) {
#if defined(__AVX512F__)
    return NC > 0 || (d % 16 == 0 && d <= 256);
#else
    (void)d;
    return false;
#endif
  }
  static void scores(bool simd, const float* qf, const T* k, const int64_t* rows, int64_t cnt,
                     int64_t g, int64_t d, float* s, int64_t n) {
#if defined(__AVX512F__)
    if (simd) return chunk_scores_512<T, NC>(qf, k, rows, cnt, g, d, s, n);
#endif
    chunk_scores_generic(qf, k, rows, cnt, g, d, s, n);
  }
  static void values(bool simd, const float* p, const T* v, const int64_t* rows, int64_t cnt,
                     int64_t g, int64_t d, int64_t n, float* acc) {
#if defined(__AVX512F__)
    if (simd) return chunk_values_512<T, NC>(p, v, rows, cnt, g, d, n, acc);
#endif
    chunk_values_generic(p, v, rows, cnt, g, d, n, acc);
  }
};

}  // namespace octavo_cpu
