// The AVX-512 VNNI kernel on weights interleaved by 16 rows (layout: quant_gemm.h): lane r of
// every vpdpbusd is weight row 16 g + r, and 4-byte runs of the activations' int8 halves
// (q = 256 hi + lo) are broadcast, so one pass over a group makes 16 outputs for up to 4
// activation rows.
#include <cstring>

#include "quant_gemm.h"

#if defined(OCTAVO_QUANT_VNNI)

namespace octavo_cpu {
namespace quant {
namespace {

inline __m512 scales16(const Weights& w, const void* base, int64_t idx) {
  if (w.half) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const c10::Half*>(base) + idx)));
  }
  return _mm512_loadu_ps(static_cast<const float*>(base) + idx);
}

// One group of 16 interleaved weight rows against MT activation rows: lane r of every vector is
// weight row 16 grp + r; 4-byte runs of the activations' int8 halves are broadcast.
template <int MT>
void group_vnni(const Weights& w, int64_t grp, const QuantActs& a, int64_t m0, float* out[MT]) {
  const uint8_t* gq = w.q + grp * kRows * w.row_bytes;
  const int64_t sbase = grp * w.ng * kRows;
  const int64_t k = w.k;
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  if (w.bits == 4) {
    // 64-input chunk c: 8 runs of 16 rows x 4 bytes; low nibbles are block 2c, high 2c+1.
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int64_t c = 0; c < k / 64; ++c) {
      __m512i h0[MT], l0[MT], h1[MT], l1[MT];
      for (int r = 0; r < MT; ++r) {
        h0[r] = l0[r] = h1[r] = l1[r] = _mm512_setzero_si512();
      }
      for (int j = 0; j < 8; ++j) {
        const __m512i p = _mm512_loadu_si512(gq + (c * 8 + j) * 64);
        const __m512i u0 = _mm512_and_si512(p, low4);
        const __m512i u1 = _mm512_and_si512(_mm512_srli_epi16(p, 4), low4);
        for (int r = 0; r < MT; ++r) {
          const int64_t off = (m0 + r) * k + c * 64 + 4 * j;
          int32_t xh0, xl0, xh1, xl1;
          std::memcpy(&xh0, a.hi.data() + off, 4);
          std::memcpy(&xl0, a.lo.data() + off, 4);
          std::memcpy(&xh1, a.hi.data() + off + 32, 4);
          std::memcpy(&xl1, a.lo.data() + off + 32, 4);
          h0[r] = _mm512_dpbusd_epi32(h0[r], u0, _mm512_set1_epi32(xh0));
          l0[r] = _mm512_dpbusd_epi32(l0[r], u0, _mm512_set1_epi32(xl0));
          h1[r] = _mm512_dpbusd_epi32(h1[r], u1, _mm512_set1_epi32(xh1));
          l1[r] = _mm512_dpbusd_epi32(l1[r], u1, _mm512_set1_epi32(xl1));
        }
      }
      const __m512 d0 = scales16(w, w.d, sbase + (2 * c) * kRows);
      const __m512 d1 = scales16(w, w.d, sbase + (2 * c + 1) * kRows);
      for (int r = 0; r < MT; ++r) {
        const float* xd = a.d.data() + (m0 + r) * w.nb + 2 * c;
        const __m512i dot0 = _mm512_add_epi32(_mm512_slli_epi32(h0[r], 8), l0[r]);
        const __m512i dot1 = _mm512_add_epi32(_mm512_slli_epi32(h1[r], 8), l1[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot0),
                                 _mm512_mul_ps(d0, _mm512_set1_ps(xd[0])), acc[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot1),
                                 _mm512_mul_ps(d1, _mm512_set1_ps(xd[1])), acc[r]);
      }
    }
  } else {
    // A byte per weight: group g is runs g * G/4 ... of 4 inputs each.
    const int64_t runs = w.group / 4;
    for (int64_t g = 0; g < w.ng; ++g) {
      __m512i h[MT], l[MT];
      for (int r = 0; r < MT; ++r) h[r] = l[r] = _mm512_setzero_si512();
      for (int64_t j = 0; j < runs; ++j) {
        const __m512i u = _mm512_loadu_si512(gq + (g * runs + j) * 64);
        for (int r = 0; r < MT; ++r) {
          const int64_t off = (m0 + r) * k + g * w.group + 4 * j;
          int32_t xh, xl;
          std::memcpy(&xh, a.hi.data() + off, 4);
          std::memcpy(&xl, a.lo.data() + off, 4);
          h[r] = _mm512_dpbusd_epi32(h[r], u, _mm512_set1_epi32(xh));
          l[r] = _mm512_dpbusd_epi32(l[r], u, _mm512_set1_epi32(xl));
        }
      }
      const __m512 d = scales16(w, w.d, sbase + g * kRows);
      for (int r = 0; r < MT; ++r) {
        const float xd = a.d[(m0 + r) * w.nb + g * w.group / kBlock];
        const __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(h[r], 8), l[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(xd)),
                                 acc[r]);
      }
    }
  }
  for (int64_t g = 0; g < w.ng; ++g) {  // the m-terms
    const __m512 mv = scales16(w, w.m, sbase + g * kRows);
    for (int r = 0; r < MT; ++r) {
      acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a.s[(m0 + r) * w.ng + g]), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) _mm512_storeu_ps(out[r] + grp * kRows, acc[r]);
}

}  // namespace

constexpr int kGroupTile = 4;  // activation rows per pass over a group (registers: 5 per row)

void linear_groups_vnni(const Weights& w, const QuantActs& a, int64_t m, int64_t n, float* op) {
  const int64_t groups = n / kRows;
  const int64_t grain =
      std::max<int64_t>(1, 32768 / (kRows * w.k * std::min<int64_t>(m, kGroupTile)));
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      for (int64_t m0 = 0; m0 < m; m0 += kGroupTile) {
        const int mt = static_cast<int>(std::min<int64_t>(kGroupTile, m - m0));
        float* rows_out[kGroupTile];
        for (int r = 0; r < mt; ++r) rows_out[r] = op + (m0 + r) * n;
        switch (mt) {
          case 4: group_vnni<4>(w, g, a, m0, rows_out); break;
          case 3: group_vnni<3>(w, g, a, m0, rows_out); break;
          case 2: group_vnni<2>(w, g, a, m0, rows_out); break;
          default: group_vnni<1>(w, g, a, m0, rows_out); break;
        }
      }
    }
  });
}

}  // namespace quant
}  // namespace octavo_cpu

#endif
