// Quantized linear layers: weights held per group of G = 32 (or 16) inputs as w = d * u + m
// (u unsigned, 4 bits packed two per byte or 8 bits; the GGUF formats repacked by
// octavo/quantization/gguf_blocks.py), activations quantized per 32-block to int16
// (x ~ xd * xq, xd = amax / 32767), so each group's product is one integer dot product plus
// the group's exact activation sum:  sum_k w_k x_k = d xd sum(u xq) + m sum(x).
//
// int16, not int8, activations: with int8 per 32-block (llama.cpp's Q8_0 activations) the
// default model's greedy tokens agree with the float32 path on 1 of 32 W6 prompts over 128
// tokens; int16 keeps ~15 bits per block and agrees on 30 (2026-11-30).
//
// Paths: AVX-512 VNNI. For 32-input weight groups, q is split exactly into int8 halves
// (q = 256 hi + lo) and each 64 weights take two vpdpbusd (u8 weights x s8 halves, no widening
// of the weights: twice as fast as widening them to int16 for vpdpwssd at one row). For 16-input
// groups (Q6_K), vpdpwssd: a 32-block is one zmm of u16 weights times one of s16 activations,
// lanes 0-7 covering inputs 0-15 and 8-15 inputs 16-31, so per-16 scales cost nothing extra.
// AVX2 (vpmaddwd) and a scalar reference use q as int16. Output rows are split over threads;
// up to kTile activation rows share one pass over a weight row.
#include "ops.h"
#include "quant_gemm.h"

#include <type_traits>

namespace octavo_cpu {
namespace {

using quant::kBlock;
using quant::kRows;
using quant::QuantActs;
using quant::Weights;
constexpr int kTile = 8;        // activation rows sharing one pass over a weight row
// 127 * 256 + 127: every q splits exactly into int8 halves q = 256 hi + lo (hi in [-127, 127],
// lo in [-128, 127]) for the VNNI path's vpdpbusd.
constexpr float kQMax = 32639.0f;

enum Isa : int64_t { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3 };

#if defined(__AVX512F__) && defined(__AVX512BW__)
// One float32 32-block, vectorised; the same values as the portable loop below (round to
// nearest even, q = 256 hi + lo with hi = floor((q + 128) / 256), sums in the same order
// up to float association within a group).
inline void quantize_block_512(const float* xb, int16_t* q, int8_t* hi, int8_t* lo, float* d,
                               float* s, int64_t group, bool split) {
  const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const __m512 id = _mm512_set1_ps(amax > 0.0f ? kQMax / amax : 0.0f);
  const __m512 lim = _mm512_set1_ps(kQMax), nlim = _mm512_set1_ps(-kQMax);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_max_ps(nlim, _mm512_min_ps(lim,
      _mm512_roundscale_ps(_mm512_mul_ps(v0, id), kRound))));
  const __m512i q1 = _mm512_cvtps_epi32(_mm512_max_ps(nlim, _mm512_min_ps(lim,
      _mm512_roundscale_ps(_mm512_mul_ps(v1, id), kRound))));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm512_cvtepi32_epi16(q0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), _mm512_cvtepi32_epi16(q1));
  if (split) {
    const __m512i c128 = _mm512_set1_epi32(128);
    const __m512i h0 = _mm512_srai_epi32(_mm512_add_epi32(q0, c128), 8);
    const __m512i h1 = _mm512_srai_epi32(_mm512_add_epi32(q1, c128), 8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hi), _mm512_cvtepi32_epi8(h0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + 16), _mm512_cvtepi32_epi8(h1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo),
                     _mm512_cvtepi32_epi8(_mm512_sub_epi32(q0, _mm512_slli_epi32(h0, 8))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + 16),
                     _mm512_cvtepi32_epi8(_mm512_sub_epi32(q1, _mm512_slli_epi32(h1, 8))));
  }
  *d = amax / kQMax;
  if (group == kBlock) {
    *s = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
  } else {  // 16-groups
    s[0] = _mm512_reduce_add_ps(v0);
    s[1] = _mm512_reduce_add_ps(v1);
  }
}
#endif

#if defined(__AVX2__)
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax256(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

#if defined(OCTAVO_QUANT_AVX2X16)
// One float32 32-block for the AVX2 kernel on interleaved weights, vectorised: q in pair order
// (quant_gemm.h, for its 8-bit weights) or, with split, only the int8 halves
// q = 256 hi + lo in input order (for its nibble weights). The same values as the portable
// loop (round to nearest even; sums up to float association within a group).
inline void quantize_block_avx2(const float* xb, int16_t* q, int8_t* hi, int8_t* lo, float* d,
                                float* s, int64_t group, bool split) {
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xb + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  const float mx = hmax256(amax);
  const __m256 id = _mm256_set1_ps(mx > 0.0f ? kQMax / mx : 0.0f);
  const __m256 lim = _mm256_set1_ps(kQMax), nlim = _mm256_set1_ps(-kQMax);
  __m256i qi[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], id),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    qi[i] = _mm256_cvtps_epi32(_mm256_max_ps(nlim, _mm256_min_ps(lim, r)));
  }
  // packs interleaves 128-bit lanes: a permute of 64-bit (16-bit data) or 32-bit (8-bit data)
  // elements restores input order.
  if (split) {
    __m256i h[4], l[4];
    for (int i = 0; i < 4; ++i) {
      h[i] = _mm256_srai_epi32(_mm256_add_epi32(qi[i], _mm256_set1_epi32(128)), 8);
      l[i] = _mm256_sub_epi32(qi[i], _mm256_slli_epi32(h[i], 8));
    }
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i hb = _mm256_packs_epi16(_mm256_packs_epi32(h[0], h[1]),
                                          _mm256_packs_epi32(h[2], h[3]));
    const __m256i lb = _mm256_packs_epi16(_mm256_packs_epi32(l[0], l[1]),
                                          _mm256_packs_epi32(l[2], l[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), _mm256_permutevar8x32_epi32(hb, order));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo), _mm256_permutevar8x32_epi32(lb, order));
  } else {
    const __m256i pairs = _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7);
    for (int i = 0; i < 2; ++i) {
      const __m256i p = _mm256_packs_epi32(_mm256_permutevar8x32_epi32(qi[2 * i], pairs),
                                           _mm256_permutevar8x32_epi32(qi[2 * i + 1], pairs));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16 * i),
                          _mm256_permute4x64_epi64(p, 0xD8));
    }
  }
  *d = mx / kQMax;
  const __m256 s0 = _mm256_add_ps(v[0], v[1]), s1 = _mm256_add_ps(v[2], v[3]);
  if (group == kBlock) {
    *s = hsum256(_mm256_add_ps(s0, s1));
  } else {  // 16-groups
    s[0] = hsum256(s0);
    s[1] = hsum256(s1);
  }
}
#endif

// vector: float32 blocks through quantize_block_512 / _avx2 where built (off for the scalar
// path, the portable reference end to end). For the AVX2 kernel on interleaved weights: pair,
// q in pair order (quant_gemm.h); split_only, the int8 halves and not q.
template <typename T>
QuantActs quantize_acts(const T* x, int64_t m, int64_t k, int64_t group, bool split,
                        bool vector, bool pair = false, bool split_only = false) {
  split = split || split_only;
  QuantActs a;
  a.k = k;
  a.nb = k / kBlock;
  a.ng = k / group;
  a.q.resize(m * k);
  a.d.resize(m * a.nb);
  a.s.resize(m * a.ng);
  if (split) {
    a.hi.resize(m * k);
    a.lo.resize(m * k);
  }
  const int64_t per = kBlock / group;  // weight groups per activation block (1 or 2)
  at::parallel_for(0, m * a.nb, row_grain(kBlock * 8), [&](int64_t begin, int64_t end) {
#if defined(OCTAVO_QUANT_AVX2X16)
    if (std::is_same_v<T, float> && vector && (pair || split_only)) {
      for (int64_t i = begin; i < end; ++i) {
        quantize_block_avx2(reinterpret_cast<const float*>(x) + i * kBlock,
                            a.q.data() + i * kBlock, a.hi.data() + i * kBlock,
                            a.lo.data() + i * kBlock, a.d.data() + i, a.s.data() + i * per,
                            group, split_only);
      }
      return;
    }
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (std::is_same_v<T, float> && vector && !pair && !split_only) {
      for (int64_t i = begin; i < end; ++i) {
        quantize_block_512(reinterpret_cast<const float*>(x) + i * kBlock, a.q.data() + i * kBlock,
                           split ? a.hi.data() + i * kBlock : nullptr,
                           split ? a.lo.data() + i * kBlock : nullptr, a.d.data() + i,
                           a.s.data() + i * per, group, split);
      }
      return;
    }
#endif
    for (int64_t i = begin; i < end; ++i) {
      const T* xb = x + i * kBlock;  // rows are contiguous, so block i is at i * 32
      float v[kBlock];
      float amax = 0.0f;
      for (int j = 0; j < kBlock; ++j) {
        v[j] = to_f(xb[j]);
        amax = std::max(amax, std::fabs(v[j]));
      }
      const float id = amax > 0.0f ? kQMax / amax : 0.0f;
      int16_t* q = a.q.data() + i * kBlock;
      for (int j = 0; j < kBlock; ++j) {
        const float r = std::nearbyint(v[j] * id);
        // pair order: 4j, 4j+2, 4j+1, 4j+3 (swap the middle two of every 4)
        const int at = pair && (j & 3) == 1 ? j + 1 : pair && (j & 3) == 2 ? j - 1 : j;
        q[at] = static_cast<int16_t>(std::max(-kQMax, std::min(kQMax, r)));
      }
      if (split) {
        for (int j = 0; j < kBlock; ++j) {
          const int h = (static_cast<int>(q[j]) + 128) >> 8;  // arithmetic shift: floor
          a.hi[i * kBlock + j] = static_cast<int8_t>(h);
          a.lo[i * kBlock + j] = static_cast<int8_t>(q[j] - 256 * h);
        }
      }
      a.d[i] = amax / kQMax;
      for (int64_t g = 0; g < per; ++g) {
        float sum = 0.0f;
        for (int64_t j = g * group; j < (g + 1) * group; ++j) sum += v[j];
        a.s[i * per + g] = sum;
      }
    }
  });
  return a;
}

// u of element kk of a weight row (the layout of gguf_blocks.pack_nibbles for 4 bits).
inline int weight_u(const uint8_t* w, int64_t bits, int64_t k, int64_t kk) {
  if (bits == 8) return w[kk];
  const int64_t c = kk / 64, i = kk % 64;
  if (c * 64 + 64 <= k) {
    const uint8_t b = w[c * 32 + (i % 32)];
    return i < 32 ? (b & 0x0F) : (b >> 4);
  }
  const uint8_t b = w[c * 32 + (i % 16)];  // a lone trailing block
  return i < 16 ? (b & 0x0F) : (b >> 4);
}

// The m-terms: sum over groups of m * sum(x).
inline float mins_dot(const float* wm, const float* xs, int64_t ng) {
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  int64_t g = 0;
  for (; g + 16 <= ng; g += 16) {
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(wm + g), _mm512_loadu_ps(xs + g), acc);
  }
  if (g < ng) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (ng - g)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, wm + g), _mm512_maskz_loadu_ps(tail, xs + g),
                          acc);
  }
  return _mm512_reduce_add_ps(acc);
#else
  float acc = 0.0f;
  for (int64_t g = 0; g < ng; ++g) acc += wm[g] * xs[g];
  return acc;
#endif
}

// Per-thread scratch for one row of interleaved or float16 weights in row-major float32 form.
struct RowBuf {
  std::vector<float> s;
  std::vector<uint8_t> q;
  explicit RowBuf(const Weights& w)
      : s(2 * w.ng), q(w.inter ? (w.bits == 4 ? w.k / 2 : w.k) : 0) {}
};

// Row r (of 16) of a 5- or 6-bit interleaved group as a byte a weight: the nibbles plus the
// high bits' fields (layout: quant_gemm.h).
inline void expand_high_bits(const Weights& w, const uint8_t* g, int64_t r, uint8_t* dst) {
  const int64_t h = w.store_bits - 4, per = 4 / h, field = (1 << h) - 1;
  for (int64_t c = 0; c < w.k / 64; ++c) {
    const uint8_t* cq = g + c * w.chunk_bytes();
    uint8_t* out = dst + c * 64;
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t t = j / per, v0 = 2 * (j % per);
      for (int64_t b = 0; b < 4; ++b) {
        const uint8_t byte = cq[j * 64 + 4 * r + b];
        const uint8_t high = cq[512 + t * 64 + 4 * r + b];
        out[4 * j + b] = (byte & 0x0F) | (((high >> (h * v0)) & field) << 4);
        out[32 + 4 * j + b] = (byte >> 4) | (((high >> (h * (v0 + 1))) & field) << 4);
      }
    }
  }
}

// Row n's bytes, row-major: a pointer into the weights, or de-interleaved into buf.q.
inline const uint8_t* row_q(const Weights& w, int64_t n, RowBuf& buf) {
  if (!w.inter) return w.q + n * w.row_bytes;
  const uint8_t* g = w.q + (n / kRows) * kRows * w.row_bytes;
  if (w.store_bits == 5 || w.store_bits == 6) {
    expand_high_bits(w, g, n % kRows, buf.q.data());
    return buf.q.data();
  }
  g += (n % kRows) * 4;
  for (int64_t j = 0; j < w.row_bytes / 4; ++j) std::memcpy(buf.q.data() + 4 * j, g + j * 64, 4);
  return buf.q.data();
}

inline void half_to_float(const c10::Half* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// Row n's scales and mins as float32: pointers into the weights, or (float16 weights) converted
// into buf [2 * ng].
struct RowScales {
  const float* d;
  const float* m;
};

template <typename S>
void gather_scales(const S* src, int64_t n, int64_t ng, float* dst) {
  const S* g = src + (n / kRows) * ng * kRows + n % kRows;
  for (int64_t i = 0; i < ng; ++i) dst[i] = static_cast<float>(g[i * kRows]);
}

inline RowScales row_scales(const Weights& w, int64_t n, RowBuf& rb) {
  float* buf = rb.s.data();
  if (w.inter) {
    if (w.two_level) {
      for (int64_t g = 0; g < w.ng; ++g) {
        buf[g] = w.two_level_d(n / kRows, g, n % kRows);
        if (!w.implicit_m) buf[w.ng + g] = w.two_level_m(n / kRows, g, n % kRows);
      }
    } else if (w.half) {
      gather_scales(static_cast<const c10::Half*>(w.d), n, w.ng, buf);
      if (!w.implicit_m) gather_scales(static_cast<const c10::Half*>(w.m), n, w.ng, buf + w.ng);
    } else {
      gather_scales(static_cast<const float*>(w.d), n, w.ng, buf);
      if (!w.implicit_m) gather_scales(static_cast<const float*>(w.m), n, w.ng, buf + w.ng);
    }
    if (w.implicit_m) {
      for (int64_t g = 0; g < w.ng; ++g) buf[w.ng + g] = w.min_factor() * buf[g];
    }
    return {buf, buf + w.ng};
  }
  if (!w.half) {
    return {static_cast<const float*>(w.d) + n * w.ng, static_cast<const float*>(w.m) + n * w.ng};
  }
  half_to_float(static_cast<const c10::Half*>(w.d) + n * w.ng, buf, w.ng);
  half_to_float(static_cast<const c10::Half*>(w.m) + n * w.ng, buf + w.ng, w.ng);
  return {buf, buf + w.ng};
}

template <int MT>
void rows_scalar(const Weights& w, int64_t n, const QuantActs& a, int64_t m0, float* out[MT],
                 RowBuf& buf) {
  const uint8_t* wq = row_q(w, n, buf);
  const RowScales rs = row_scales(w, n, buf);
  const float* wd = rs.d;
  for (int r = 0; r < MT; ++r) {
    const int64_t row = m0 + r;
    float acc = 0.0f;
    for (int64_t b = 0; b < w.nb; ++b) {
      const int16_t* xq = a.q.data() + row * w.k + b * kBlock;
      int dot[2] = {0, 0};  // inputs 0-15 and 16-31 of the block
      for (int j = 0; j < kBlock; ++j) {
        dot[j / 16] += weight_u(wq, w.bits, w.k, b * kBlock + j) * xq[j];
      }
      const float xd = a.d[row * w.nb + b];
      acc += w.group == kBlock
                 ? wd[b] * xd * static_cast<float>(dot[0] + dot[1])
                 : xd * (wd[2 * b] * static_cast<float>(dot[0]) +
                         wd[2 * b + 1] * static_cast<float>(dot[1]));
    }
    out[r][n] = acc + mins_dot(rs.m, a.s.data() + row * w.ng, w.ng);
  }
}

#if defined(__AVX2__)

// The 32 u values (bytes, in input order) of weight block b of a row.
inline __m256i block_u8(const uint8_t* wq, int64_t bits, int64_t k, int64_t b) {
  if (bits == 8) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + b * kBlock));
  const int64_t c = b / 2;
  if (c * 64 + 64 <= k) {  // a whole 64-chunk: block 2c in the low nibbles, 2c+1 in the high
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + c * 32));
    return (b & 1) ? _mm256_and_si256(_mm256_srli_epi16(p, 4), low4) : _mm256_and_si256(p, low4);
  }
  const __m128i low4 = _mm_set1_epi8(0x0F);  // a lone trailing block: 16 bytes
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wq + c * 32));
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(t, 4), low4), _mm_and_si128(t, low4));
}

template <int MT>
void rows_avx2(const Weights& w, int64_t n, const QuantActs& a, int64_t m0, float* out[MT],
               RowBuf& buf) {
  const uint8_t* wq = row_q(w, n, buf);
  const RowScales rs = row_scales(w, n, buf);
  const float* wd = rs.d;
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < w.nb; ++b) {
    const __m256i u8 = block_u8(wq, w.bits, w.k, b);
    const __m256i u0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(u8));
    const __m256i u1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(u8, 1));
    const bool one = w.group == kBlock;
    const float w0 = one ? wd[b] : wd[2 * b], w1 = one ? wd[b] : wd[2 * b + 1];
    for (int r = 0; r < MT; ++r) {
      const int64_t row = m0 + r;
      const int16_t* xq = a.q.data() + row * w.k + b * kBlock;
      const __m256i d0 =
          _mm256_madd_epi16(u0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)));
      const __m256i d1 =
          _mm256_madd_epi16(u1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16)));
      const float xd = a.d[row * w.nb + b];
      if (one) {
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(d0, d1)),
                                 _mm256_set1_ps(w0 * xd), acc[r]);
      } else {
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_set1_ps(w0 * xd), acc[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_set1_ps(w1 * xd), acc[r]);
      }
    }
  }
  for (int r = 0; r < MT; ++r) {
    const int64_t row = m0 + r;
    out[r][n] = hsum256(acc[r]) + mins_dot(rs.m, a.s.data() + row * w.ng, w.ng);
  }
}
#endif

#if defined(OCTAVO_QUANT_VNNI)
// 32-input weight groups: u8 weights times the int8 halves of the activations (vpdpbusd, four
// products per lane, no widening of the weights), two blocks per 64-byte vector: lanes 0-7
// hold block 2c, lanes 8-15 block 2c+1, and 256 * dot(hi) + dot(lo) is dot(q) exactly.
template <int MT>
void rows_vnni8(const Weights& w, int64_t n, const QuantActs& a, int64_t m0, float* out[MT],
                RowBuf& buf) {
  const uint8_t* wq = row_q(w, n, buf);
  const RowScales rs = row_scales(w, n, buf);
  const float* wd = rs.d;
  const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t full = w.k / 64;
  for (int64_t c = 0; c < full; ++c) {
    __m512i u;
    if (w.bits == 4) {
      const __m256i low4 = _mm256_set1_epi8(0x0F);
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + c * 32));
      u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(p, low4)),
                             _mm256_and_si256(_mm256_srli_epi16(p, 4), low4), 1);
    } else {
      u = _mm512_loadu_si512(wq + c * 64);
    }
    const __m128 wd2 = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(wd + 2 * c)));
    for (int r = 0; r < MT; ++r) {
      const int64_t row = m0 + r;
      const int64_t off = row * w.k + c * 64;
      const __m512i dh = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                             _mm512_loadu_si512(a.hi.data() + off));
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_slli_epi32(dh, 8), u,
                                              _mm512_loadu_si512(a.lo.data() + off));
      const __m128 xd2 = _mm_castpd_ps(
          _mm_load_sd(reinterpret_cast<const double*>(a.d.data() + row * w.nb + 2 * c)));
      const __m512 scale =
          _mm512_permutexvar_ps(pair_idx, _mm512_castps128_ps512(_mm_mul_ps(wd2, xd2)));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) {
    const int64_t row = m0 + r;
    float y = _mm512_reduce_add_ps(acc[r]);
    if (2 * full < w.nb) {  // the lone trailing block
      const int64_t b = 2 * full;
      const __m512i u = _mm512_cvtepu8_epi16(block_u8(wq, w.bits, w.k, b));
      const __m512i dot = _mm512_dpwssd_epi32(_mm512_setzero_si512(), u,
                                              _mm512_loadu_si512(a.q.data() + row * w.k +
                                                                 b * kBlock));
      y += wd[b] * a.d[row * w.nb + b] * static_cast<float>(_mm512_reduce_add_epi32(dot));
    }
    out[r][n] = y + mins_dot(rs.m, a.s.data() + row * w.ng, w.ng);
  }
}

template <int MT>
void rows_vnni(const Weights& w, int64_t n, const QuantActs& a, int64_t m0, float* out[MT],
               RowBuf& buf) {
  const uint8_t* wq = row_q(w, n, buf);
  const RowScales rs = row_scales(w, n, buf);
  const float* wd = rs.d;
  // Lanes 0-7 of a block's dot hold inputs 0-15, lanes 8-15 inputs 16-31: with per-16 weight
  // scales, spread the pair so.
  const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < w.nb; ++b) {
    const __m512i u = _mm512_cvtepu8_epi16(block_u8(wq, w.bits, w.k, b));
    const __m512 ws = w.group == kBlock
        ? _mm512_set1_ps(wd[b])
        : _mm512_permutexvar_ps(pair_idx, _mm512_castps128_ps512(_mm_castpd_ps(
              _mm_load_sd(reinterpret_cast<const double*>(wd + 2 * b)))));
    for (int r = 0; r < MT; ++r) {
      const int64_t row = m0 + r;
      const __m512i x = _mm512_loadu_si512(a.q.data() + row * w.k + b * kBlock);
      const __m512i dot = _mm512_dpwssd_epi32(_mm512_setzero_si512(), u, x);
      const __m512 scale = _mm512_mul_ps(ws, _mm512_set1_ps(a.d[row * w.nb + b]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) {
    const int64_t row = m0 + r;
    out[r][n] = _mm512_reduce_add_ps(acc[r]) +
                mins_dot(rs.m, a.s.data() + row * w.ng, w.ng);
  }
}
#endif

int64_t best_isa() {
#if defined(OCTAVO_QUANT_VNNI)
  return kAvx512;
#elif defined(__AVX2__)
  return kAvx2;
#else
  return kScalar;
#endif
}

template <int MT>
void rows(int64_t isa, const Weights& w, int64_t n, const QuantActs& a, int64_t m0,
          float* out[MT], RowBuf& buf) {
#if defined(OCTAVO_QUANT_VNNI)
  if (isa == kAvx512) {
    if (w.group == kBlock) return rows_vnni8<MT>(w, n, a, m0, out, buf);
    return rows_vnni<MT>(w, n, a, m0, out, buf);
  }
#endif
#if defined(__AVX2__)
  if (isa == kAvx2) return rows_avx2<MT>(w, n, a, m0, out, buf);
#endif
  rows_scalar<MT>(w, n, a, m0, out, buf);
}

Weights check_weights(const at::Tensor& qweight, const at::Tensor& scales,
                      const at::Tensor& mins, int64_t k) {
  check_cpu(qweight, "qweight");
  TORCH_CHECK(k > 0 && k % kBlock == 0, "in_features must be a positive multiple of 32, got ", k);
  const bool inter = qweight.dim() == 3;
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.is_contiguous() &&
                  (qweight.dim() == 2 || (inter && qweight.size(2) == kRows * 4)),
              "qweight must be a contiguous uint8 [N, K or K/2] or, interleaved, "
              "[N/16, (K, K/2, 5K/8 or 3K/4)/4, 64]");
  const int64_t n = inter ? qweight.size(0) * kRows : qweight.size(0);
  const int64_t rb = inter ? qweight.size(1) * 4 : qweight.size(1);
  TORCH_CHECK(!inter || k % 64 == 0, "interleaved weights need in_features % 64 == 0");
  int64_t store = 0;
  if (rb == k) store = 8;
  else if (rb * 2 == k) store = 4;
  else if (inter && rb * 8 == 5 * k) store = 5;
  else if (inter && rb * 4 == 3 * k) store = 6;
  TORCH_CHECK(store != 0, "qweight has ", rb, " bytes per row: not K or K/2 (or, interleaved, "
              "5K/8 or 3K/4) for K=", k);
  const int64_t sd = inter ? 3 : 2;
  const auto st = scales.scalar_type();
  const int64_t two_level = st == at::kByte ? 1 : st == at::kChar ? 2 : 0;
  if (two_level) {  // K-quants' integer scales (quant_gemm.h)
    TORCH_CHECK(inter && k % 256 == 0 && scales.dim() == 3 && scales.is_contiguous() &&
                    scales.size(0) * kRows == n && scales.size(2) == kRows,
                "integer (two-level) scales need interleaved weights, K % 256 == 0 and a "
                "contiguous [N/16, K/G + 4 K/256, 16] tensor");
    const int64_t ng = scales.size(1) - 4 * (k / 256);
    TORCH_CHECK(ng * 32 == k || ng * 16 == k, "two-level scales: ", scales.size(1),
                " rows per group do not fit K=", k);
    const bool implicit = mins.numel() == 0;
    TORCH_CHECK(implicit ? two_level == 2 : (two_level == 1 && mins.scalar_type() == at::kByte &&
                                              mins.is_contiguous() && mins.dim() == 3 &&
                                              mins.size(0) == scales.size(0) &&
                                              mins.size(1) == ng && mins.size(2) == kRows),
                "two-level scales: uint8 scales take uint8 mins [N/16, K/G, 16], int8 ones none");
    return Weights{qweight.data_ptr<uint8_t>(), scales.data_ptr(),
                   implicit ? nullptr : mins.data_ptr(), false, inter, store == 4 ? 4 : 8, k,
                   k / kBlock, k / ng, ng, rb, store, implicit, two_level,
                   scales.size(1) * kRows, ng * 32 == k ? 3 : 4};
  }
  TORCH_CHECK(scales.dim() == sd && scales.size(1) > 0 &&
                  (scales.size(1) * 32 == k || scales.size(1) * 16 == k),
              "scales and mins must be contiguous float32 or float16 [N, K/32] or [N, K/16] "
              "(interleaved: [N/16, K/G, 16]) for N=", n, ", K=", k);
  const int64_t ng = scales.size(1);
  const bool implicit = mins.numel() == 0;
  TORCH_CHECK(!implicit || inter, "only interleaved weights may leave out their mins");
  for (const at::Tensor* t : {&scales, &mins}) {
    if (implicit && t == &mins) continue;
    const bool shape_ok = inter ? (t->dim() == 3 && t->size(0) * kRows == n &&
                                   t->size(1) == ng && t->size(2) == kRows)
                                : (t->dim() == 2 && t->size(0) == n && t->size(1) == ng);
    TORCH_CHECK((st == at::kFloat || st == at::kHalf) && t->scalar_type() == st &&
                    t->is_contiguous() && shape_ok,
                "scales and mins must be contiguous float32 or float16 (both the same) [N, K/32] "
                "or [N, K/16] (interleaved: [N/16, K/G, 16]) with N=", n, ", K/G=", ng);
  }
  return Weights{qweight.data_ptr<uint8_t>(), scales.data_ptr(),
                 implicit ? nullptr : mins.data_ptr(), st == at::kHalf, inter,
                 store == 4 ? 4 : 8, k, k / kBlock, k / ng, ng, rb, store, implicit, 0, 0, 0};
}

inline int64_t out_features(const Weights& w, const at::Tensor& qweight) {
  return w.inter ? qweight.size(0) * kRows : qweight.size(0);
}

template <int MT>
void tile(int64_t isa, const Weights& w, const QuantActs& a, int64_t m0, int64_t begin,
          int64_t end, float* out[MT], RowBuf& buf) {
  for (int64_t j = begin; j < end; ++j) rows<MT>(isa, w, j, a, m0, out, buf);
}

}  // namespace

std::vector<int64_t> quant_isas() {
  std::vector<int64_t> out{kScalar};
#if defined(__AVX2__)
  out.push_back(kAvx2);
#endif
#if defined(OCTAVO_QUANT_VNNI)
  out.push_back(kAvx512);
#endif
  return out;
}

at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                       const at::Tensor& mins, int64_t in_features, int64_t isa) {
  check_cpu(x, "x");
  const Weights w = check_weights(qweight, scales, mins, in_features);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == in_features && x.is_contiguous(),
              "x must be a contiguous [M, ", in_features, "]");
  if (isa == kAuto) isa = best_isa();
  const auto isas = quant_isas();
  TORCH_CHECK(std::find(isas.begin(), isas.end(), isa) != isas.end(), "isa ", isa,
              " is not built on this CPU");
  const int64_t m = x.size(0), n = out_features(w, qweight);
  at::Tensor out = at::empty({m, n}, x.options().dtype(at::kFloat));
  if (m == 0 || n == 0) return out.to(x.scalar_type());
  const bool grouped = isa == kAvx512 && w.inter;
#if defined(OCTAVO_QUANT_AVX2X16)
  const bool grouped2 = isa == kAvx2 && w.inter;
#else
  const bool grouped2 = false;
#endif
  // The AVX2 kernel reads 8-bit weights against q in pair order, nibbles against the halves.
  const bool bytes = w.store_bits == 8;
  QuantActs a = OCTAVO_DISPATCH(x.scalar_type(), "gguf_linear", [&] {
    return quantize_acts(x.data_ptr<scalar_t>(), m, in_features, w.group,
                         isa == kAvx512 && (w.group == kBlock || grouped), isa != kScalar,
                         grouped2 && bytes, grouped2 && !bytes);
  });
  float* op = out.data_ptr<float>();
#if defined(OCTAVO_QUANT_VNNI)
  if (grouped) {
    quant::linear_groups_vnni(w, a, m, n, op);
    return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
  }
#endif
#if defined(OCTAVO_QUANT_AVX2X16)
  if (grouped2) {
    quant::linear_groups_avx2(w, a, m, n, op);
    return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
  }
#endif
  const int64_t grain = std::max<int64_t>(1, 32768 / (in_features * std::min<int64_t>(m, kTile)));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    RowBuf buf(w);
    for (int64_t m0 = 0; m0 < m; m0 += kTile) {
      const int mt = static_cast<int>(std::min<int64_t>(kTile, m - m0));
      float* rows_out[kTile];
      for (int r = 0; r < mt; ++r) rows_out[r] = op + (m0 + r) * n;
      switch (mt) {
        case 8: tile<8>(isa, w, a, m0, begin, end, rows_out, buf); break;
        case 7: tile<7>(isa, w, a, m0, begin, end, rows_out, buf); break;
        case 6: tile<6>(isa, w, a, m0, begin, end, rows_out, buf); break;
        case 5: tile<5>(isa, w, a, m0, begin, end, rows_out, buf); break;
        case 4: tile<4>(isa, w, a, m0, begin, end, rows_out, buf); break;
        case 3: tile<3>(isa, w, a, m0, begin, end, rows_out, buf); break;
        case 2: tile<2>(isa, w, a, m0, begin, end, rows_out, buf); break;
        default: tile<1>(isa, w, a, m0, begin, end, rows_out, buf); break;
      }
    }
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

namespace {

// Row j of the weight as float32 into dst[K]: d * u + m per group.
void dequant_row(const Weights& w, int64_t j, float* dst, RowBuf& buf) {
  const uint8_t* wq = row_q(w, j, buf);
  const RowScales rs = row_scales(w, j, buf);
  const float* wd = rs.d;
  const float* wm = rs.m;
#if defined(__AVX512F__) && defined(__AVX2__)
  for (int64_t b = 0; b < w.nb; ++b) {
    const __m256i u8 = block_u8(wq, w.bits, w.k, b);
    const bool one = w.group == kBlock;
    const int64_t g0 = one ? b : 2 * b, g1 = one ? b : 2 * b + 1;
    const __m512 u0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(u8)));
    const __m512 u1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(u8, 1)));
    _mm512_storeu_ps(dst + b * kBlock,
                     _mm512_fmadd_ps(u0, _mm512_set1_ps(wd[g0]), _mm512_set1_ps(wm[g0])));
    _mm512_storeu_ps(dst + b * kBlock + 16,
                     _mm512_fmadd_ps(u1, _mm512_set1_ps(wd[g1]), _mm512_set1_ps(wm[g1])));
  }
#else
  for (int64_t kk = 0; kk < w.k; ++kk) {
    const int64_t g = kk / w.group;
    dst[kk] = wd[g] * static_cast<float>(weight_u(wq, w.bits, w.k, kk)) + wm[g];
  }
#endif
}

constexpr int64_t kDenseChunk = 64;  // weight rows dequantized at a time (stays in L2)

}  // namespace

at::Tensor gguf_dequantize(const at::Tensor& qweight, const at::Tensor& scales,
                           const at::Tensor& mins, int64_t in_features) {
  const Weights w = check_weights(qweight, scales, mins, in_features);
  const int64_t n = out_features(w, qweight), k = in_features;
  at::Tensor out = at::empty({n, k}, scales.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, row_grain(k), [&](int64_t begin, int64_t end) {
    RowBuf rb(w);
    for (int64_t j = begin; j < end; ++j) dequant_row(w, j, op + j * k, rb);
  });
  return out;
}

at::Tensor gguf_dequantize_rows(const at::Tensor& qweight, const at::Tensor& scales,
                                const at::Tensor& mins, const at::Tensor& ids,
                                int64_t in_features) {
  const Weights w = check_weights(qweight, scales, mins, in_features);
  TORCH_CHECK(ids.device().is_cpu() && ids.dim() == 1 && ids.scalar_type() == at::kLong,
              "ids must be a 1-D int64 CPU tensor");
  const at::Tensor idc = ids.contiguous();
  const int64_t n = out_features(w, qweight), k = in_features, t = idc.size(0);
  const int64_t* ip = idc.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i) {
    TORCH_CHECK(ip[i] >= 0 && ip[i] < n, "ids[", i, "] = ", ip[i], " is outside [0, ", n, ")");
  }
  at::Tensor out = at::empty({t, k}, scales.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, t, row_grain(k), [&](int64_t begin, int64_t end) {
    RowBuf rb(w);
    for (int64_t i = begin; i < end; ++i) dequant_row(w, ip[i], op + i * k, rb);
  });
  return out;
}

at::Tensor gguf_linear_dense(const at::Tensor& x, const at::Tensor& qweight,
                             const at::Tensor& scales, const at::Tensor& mins,
                             int64_t in_features) {
  check_cpu(x, "x");
  const Weights w = check_weights(qweight, scales, mins, in_features);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == in_features && x.is_contiguous(),
              "x must be a contiguous [M, ", in_features, "]");
  const int64_t m = x.size(0), n = out_features(w, qweight), k = in_features;
  const at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  at::Tensor out = at::empty({m, n}, xf.options());
  if (m == 0 || n == 0) return out.to(x.scalar_type());
  const int64_t chunks = (n + kDenseChunk - 1) / kDenseChunk;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(kDenseChunk * k);
    RowBuf rb(w);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = c * kDenseChunk, rows = std::min(kDenseChunk, n - n0);
      for (int64_t r = 0; r < rows; ++r) dequant_row(w, n0 + r, buf.data() + r * k, rb);
      const at::Tensor wt = at::from_blob(buf.data(), {rows, k}, xf.options());
      // Inside the pool's threads the BLAS call runs on this thread alone. Its result is
      // copied with plain stores: `out` may be an inference tensor, and InferenceMode is not
      // set on the pool's threads, so an ATen in-place copy into it would raise.
      const at::Tensor yc = at::mm(xf, wt.t()).contiguous();
      const float* yp = yc.data_ptr<float>();
      float* op = out.data_ptr<float>();
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(op + i * n + n0, yp + i * rows, rows * sizeof(float));
      }
    }
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace octavo_cpu
