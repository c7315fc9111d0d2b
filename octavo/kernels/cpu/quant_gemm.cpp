// Quantized linear layers: weights held per 32-block as w = d * u + m (u unsigned, 4 bits
// packed two per byte or 8 bits; the GGUF formats repacked by octavo/quantization/gguf_blocks.py),
// activations quantized per 32-block to int8 (x ~ xd * xq), so each block's product is one
// integer dot product:  sum_k w_k x_k = d xd sum(u xq) + m xd sum(xq).
//
// Paths: AVX-512 VNNI (vpdpbusd: u8 weights x s8 activations, no offset needed because u is
// unsigned), AVX2 (vpmaddubsw for 4-bit u, vpmaddwd on widened 8-bit u, which could saturate
// vpmaddubsw), and a scalar reference. Output rows are split over threads.
#include "common.h"
#include "ops.h"

#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define OCTAVO_QUANT_VNNI 1
#endif

namespace octavo_cpu {
namespace {

constexpr int64_t kBlock = 32;
constexpr int kTile = 4;  // activation rows sharing one pass over a weight row

enum Isa : int64_t { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3 };

// Activations quantized per 32-block: q [M, K], d and s = d * sum(q) [M, K/32].
struct QuantActs {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  int64_t k, nb;
};

template <typename T>
QuantActs quantize_acts(const T* x, int64_t m, int64_t k) {
  QuantActs a;
  a.k = k;
  a.nb = k / kBlock;
  a.q.resize(m * k);
  a.d.resize(m * a.nb);
  a.s.resize(m * a.nb);
  at::parallel_for(0, m * a.nb, row_grain(kBlock * 8), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* xb = x + i * kBlock;  // rows are contiguous, so block i is at i * 32
      float v[kBlock];
      float amax = 0.0f;
      for (int j = 0; j < kBlock; ++j) {
        v[j] = to_f(xb[j]);
        amax = std::max(amax, std::fabs(v[j]));
      }
      const float d = amax / 127.0f;
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int sum = 0;
      int8_t* q = a.q.data() + i * kBlock;
      for (int j = 0; j < kBlock; ++j) {
        const int qi = static_cast<int>(std::nearbyint(v[j] * id));
        q[j] = static_cast<int8_t>(qi);
        sum += qi;
      }
      a.d[i] = d;
      a.s[i] = d * static_cast<float>(sum);
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

// Integer dot of weight block `b` with 32 activation values: the portable path and the tail.
inline int block_dot_scalar(const uint8_t* w, int64_t bits, int64_t k, int64_t b,
                            const int8_t* xq) {
  int acc = 0;
  for (int j = 0; j < kBlock; ++j) acc += weight_u(w, bits, k, b * kBlock + j) * xq[j];
  return acc;
}

// The m-terms: sum over blocks of m * xd * sum(xq).
inline float mins_dot(const float* wm, const float* xs, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) acc += wm[b] * xs[b];
  return acc;
}

struct Weights {
  const uint8_t* q;
  const float* d;
  const float* m;
  int64_t bits, k, nb, row_bytes;
};

template <int MT>
void rows_scalar(const Weights& w, int64_t n, const QuantActs& a, int64_t m0, float* out[MT]) {
  const uint8_t* wq = w.q + n * w.row_bytes;
  const float* wd = w.d + n * w.nb;
  for (int r = 0; r < MT; ++r) {
    const int64_t row = m0 + r;
    float acc = 0.0f;
    for (int64_t b = 0; b < w.nb; ++b) {
      const int dot = block_dot_scalar(wq, w.bits, w.k, b, a.q.data() + row * w.k + b * kBlock);
      acc += wd[b] * a.d[row * w.nb + b] * static_cast<float>(dot);
    }
    out[r][n] = acc + mins_dot(w.m + n * w.nb, a.s.data() + row * w.nb, w.nb);
  }
}

#if defined(__AVX2__)
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 32 products of u (u8) and xq (s8) summed into 8 int32 lanes.
inline __m256i dot32_avx2(__m256i u, const int8_t* xq, int64_t bits) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  const __m256i ones = _mm256_set1_epi16(1);
  if (bits == 4) {  // u <= 15: pairs of u * x stay far inside int16
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones);
  }
  const __m256i u0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(u));
  const __m256i u1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(u, 1));
  const __m256i x0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(x));
  const __m256i x1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(x, 1));
  return _mm256_add_epi32(_mm256_madd_epi16(u0, x0), _mm256_madd_epi16(u1, x1));
}

template <int MT>
void rows_avx2(const Weights& w, int64_t n, const QuantActs& a, int64_t m0, float* out[MT]) {
  const uint8_t* wq = w.q + n * w.row_bytes;
  const float* wd = w.d + n * w.nb;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t full = w.k / 64;
  for (int64_t c = 0; c < full; ++c) {
    __m256i u[2];
    if (w.bits == 4) {
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + c * 32));
      u[0] = _mm256_and_si256(p, low4);
      u[1] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low4);
    } else {
      u[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + c * 64));
      u[1] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + c * 64 + 32));
    }
    for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * c + h;
      for (int r = 0; r < MT; ++r) {
        const int64_t row = m0 + r;
        const __m256i dot = dot32_avx2(u[h], a.q.data() + row * w.k + b * kBlock, w.bits);
        const __m256 scale = _mm256_set1_ps(wd[b] * a.d[row * w.nb + b]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
      }
    }
  }
  for (int r = 0; r < MT; ++r) {
    const int64_t row = m0 + r;
    float y = hsum256(acc[r]);
    for (int64_t b = 2 * full; b < w.nb; ++b) {  // the lone trailing block
      const int dot = block_dot_scalar(wq, w.bits, w.k, b, a.q.data() + row * w.k + b * kBlock);
      y += wd[b] * a.d[row * w.nb + b] * static_cast<float>(dot);
    }
    out[r][n] = y + mins_dot(w.m + n * w.nb, a.s.data() + row * w.nb, w.nb);
  }
}
#endif

#if defined(OCTAVO_QUANT_VNNI)
template <int MT>
void rows_vnni(const Weights& w, int64_t n, const QuantActs& a, int64_t m0, float* out[MT]) {
  const uint8_t* wq = w.q + n * w.row_bytes;
  const float* wd = w.d + n * w.nb;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // Lanes 0-7 hold block 2c's products, lanes 8-15 block 2c+1's: spread two scales so.
  const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t full = w.k / 64;
  for (int64_t c = 0; c < full; ++c) {
    __m512i u;
    if (w.bits == 4) {
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + c * 32));
      const __m256i lo = _mm256_and_si256(p, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low4);
      u = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    } else {
      u = _mm512_loadu_si512(wq + c * 64);
    }
    const __m128 wd2 = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(wd + 2 * c)));
    for (int r = 0; r < MT; ++r) {
      const int64_t row = m0 + r;
      const __m512i x = _mm512_loadu_si512(a.q.data() + row * w.k + c * 64);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x);
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
    for (int64_t b = 2 * full; b < w.nb; ++b) {  // the lone trailing block
      const int dot = block_dot_scalar(wq, w.bits, w.k, b, a.q.data() + row * w.k + b * kBlock);
      y += wd[b] * a.d[row * w.nb + b] * static_cast<float>(dot);
    }
    out[r][n] = y + mins_dot(w.m + n * w.nb, a.s.data() + row * w.nb, w.nb);
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
          float* out[MT]) {
#if defined(OCTAVO_QUANT_VNNI)
  if (isa == kAvx512) return rows_vnni<MT>(w, n, a, m0, out);
#endif
#if defined(__AVX2__)
  if (isa == kAvx2) return rows_avx2<MT>(w, n, a, m0, out);
#endif
  rows_scalar<MT>(w, n, a, m0, out);
}

Weights check_weights(const at::Tensor& qweight, const at::Tensor& scales,
                      const at::Tensor& mins, int64_t k) {
  check_cpu(qweight, "qweight");
  TORCH_CHECK(k > 0 && k % kBlock == 0, "in_features must be a positive multiple of 32, got ", k);
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.dim() == 2 &&
                  qweight.is_contiguous(), "qweight must be a contiguous uint8 [N, K or K/2]");
  const int64_t bits = qweight.size(1) == k ? 8 : 4;
  TORCH_CHECK(bits == 8 || qweight.size(1) * 2 == k, "qweight has ", qweight.size(1),
              " bytes per row: neither K nor K/2 for K=", k);
  const int64_t n = qweight.size(0), nb = k / kBlock;
  for (const at::Tensor* t : {&scales, &mins}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 &&
                    t->size(0) == n && t->size(1) == nb,
                "scales and mins must be contiguous float32 [N, K/32] = [", n, ", ", nb, "]");
  }
  return Weights{qweight.data_ptr<uint8_t>(), scales.data_ptr<float>(), mins.data_ptr<float>(),
                 bits, k, nb, qweight.size(1)};
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
  const int64_t m = x.size(0), n = qweight.size(0);
  at::Tensor out = at::empty({m, n}, x.options().dtype(at::kFloat));
  if (m == 0 || n == 0) return out.to(x.scalar_type());
  QuantActs a = OCTAVO_DISPATCH(x.scalar_type(), "gguf_linear", [&] {
    return quantize_acts(x.data_ptr<scalar_t>(), m, in_features);
  });
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 32768 / (in_features * std::min<int64_t>(m, kTile)));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t m0 = 0; m0 < m; m0 += kTile) {
      const int mt = static_cast<int>(std::min<int64_t>(kTile, m - m0));
      float* rows_out[kTile];
      for (int r = 0; r < mt; ++r) rows_out[r] = op + (m0 + r) * n;
      for (int64_t j = begin; j < end; ++j) {
        switch (mt) {
          case 4: rows<4>(isa, w, j, a, m0, rows_out); break;
          case 3: rows<3>(isa, w, j, a, m0, rows_out); break;
          case 2: rows<2>(isa, w, j, a, m0, rows_out); break;
          default: rows<1>(isa, w, j, a, m0, rows_out); break;
        }
      }
    }
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

at::Tensor gguf_dequantize(const at::Tensor& qweight, const at::Tensor& scales,
                           const at::Tensor& mins, int64_t in_features) {
  const Weights w = check_weights(qweight, scales, mins, in_features);
  const int64_t n = qweight.size(0), k = in_features;
  at::Tensor out = at::empty({n, k}, scales.options());
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, row_grain(k), [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const uint8_t* wq = w.q + j * w.row_bytes;
      for (int64_t kk = 0; kk < k; ++kk) {
        const int64_t b = kk / kBlock;
        op[j * k + kk] = w.d[j * w.nb + b] * static_cast<float>(weight_u(wq, w.bits, k, kk)) +
                         w.m[j * w.nb + b];
      }
    }
  });
  return out;
}

}  // namespace octavo_cpu
