// The AVX-512 VNNI kernel on weights interleaved by 16 rows (layout: quant_gemm.h): lane r of
// every vpdpbusd is weight row 16 g + r, and 4-byte runs of the activations' int8 halves
// (q = 256 hi + lo) are broadcast, so one pass over a group makes 16 outputs for up to 4
// activation rows.

#include "quant_gemm.h"

#if defined(OCTAVO_QUANT_VNNI)

namespace octavo_cpu {
namespace quant {
namespace {

// The per-group helpers are forced inline: gcc 12 left group_d out of line, a call per
// 16-input group of Q6_K.
#define OCTAVO_AI inline __attribute__((always_inline))

// acc += u (16 lanes x 4 unsigned bytes) . the 4 signed bytes at x, broadcast to every lane:
// one vpdpbusd with an embedded {1to16} broadcast of its memory operand, where gcc 12 emits a
// separate vpbroadcastd for _mm512_set1_epi32 (3072x576 at M = 32, one thread: 0.626 ->
// 0.609 ms).
inline void dpbusd_bcst(__m512i& acc, __m512i u, const int8_t* x) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(u), "m"(*reinterpret_cast<const int32_t*>(x)));
}

OCTAVO_AI __m512 scales16(const Weights& w, const void* base, int64_t idx) {
  if (w.half) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const c10::Half*>(base) + idx)));
  }
  return _mm512_loadu_ps(static_cast<const float*>(base) + idx);
}

OCTAVO_AI __m512 half16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The 16 rows' d of group g of 16-row group grp: float scales, or (two-level) the integer
// scale times the float16 super-block d, exact in float32.
// TWO: whether the layout may hold two-level scales (the nibble ones; bytes never do).
template <bool TWO = true>
OCTAVO_AI __m512 group_d(const Weights& w, int64_t grp, int64_t g) {
  if (!TWO || !w.two_level) return scales16(w, w.d, (grp * w.ng + g) * kRows);
  const __m128i sub = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
      static_cast<const uint8_t*>(w.d) + grp * w.sstride + g * kRows));
  const __m512i si = w.two_level == 1 ? _mm512_cvtepu8_epi32(sub) : _mm512_cvtepi8_epi32(sub);
  return _mm512_mul_ps(half16(w.super16(grp, g, 0)), _mm512_cvtepi32_ps(si));
}

// ... and their m.
OCTAVO_AI __m512 group_m(const Weights& w, int64_t grp, int64_t g) {
  if (w.implicit_m) return _mm512_mul_ps(group_d(w, grp, g), _mm512_set1_ps(w.min_factor()));
  if (!w.two_level) return scales16(w, w.m, (grp * w.ng + g) * kRows);
  const __m128i mn = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
      static_cast<const uint8_t*>(w.m) + (grp * w.ng + g) * kRows));
  const __m512 dmin = half16(w.super16(grp, g, 1));
  return _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), dmin),
                       _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)));
}

// u of one nibble vector's weights (u: its nibbles, bits 4-7 clear) with its high bits, the
// H-bit field at bit SHIFT of each byte of hv (quant_gemm.h): a 16-bit shift (the field's
// bits stay in their byte) and one vpternlog, u | (shifted & field mask).
template <int H, int SHIFT>
OCTAVO_AI __m512i add_high(__m512i u, __m512i hv) {
  const __m512i field = _mm512_set1_epi8(static_cast<char>(((1 << H) - 1) << 4));
  __m512i t = hv;
  if constexpr (SHIFT < 4) t = _mm512_slli_epi16(hv, 4 - SHIFT);
  if constexpr (SHIFT > 4) t = _mm512_srli_epi16(hv, SHIFT - 4);
  return _mm512_ternarylogic_epi32(u, t, field, 0xF8);  // A | (B & C)
}

// Run J's two vectors (low nibbles: slot 2 (J % (4/H)), high: the next) with their high bits.
template <int H, int J>
OCTAVO_AI void add_high_run(__m512i& u0, __m512i& u1, const uint8_t* cq) {
  constexpr int per = 4 / H, v0 = 2 * (J % per);
  const __m512i hv = _mm512_loadu_si512(cq + 512 + (J / per) * 64);
  u0 = add_high<H, H * v0>(u0, hv);
  u1 = add_high<H, H * (v0 + 1)>(u1, hv);
}

// Weight group g's share: acc[r] += (256 dot(hi) + dot(lo)) * d * xd, the integer halves'
// accumulators then cleared; with FOLD (the nibble layouts) the group's m-term too,
// m * sum(x over g) (an implicit m is a multiple of the d already loaded), instead of a second
// pass over the groups. Folded
// is faster for the nibble layouts (Q5_0 9728x896 one thread 383-409 -> 331-338 us, Q6_K
// 37984x1536 3409-3498 -> 2995-3034), the second pass for bytes (Q8_0 49152x576 955-973 us
// against 1104-1144 folded), measured alternately on the 2-core EPYC.
template <int MT, bool FOLD>
OCTAVO_AI void flush(const Weights& w, int64_t grp, int64_t g, __m512 acc[MT], __m512i h[MT],
                     __m512i l[MT], const QuantActs& a, int64_t m0, int64_t block) {
  const __m512 d = group_d<FOLD>(w, grp, g);
  __m512 mv = _mm512_setzero_ps();
  if constexpr (FOLD) {
    mv = w.implicit_m ? _mm512_mul_ps(d, _mm512_set1_ps(w.min_factor())) : group_m(w, grp, g);
  }
  for (int r = 0; r < MT; ++r) {
    const __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(h[r], 8), l[r]);
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                             _mm512_mul_ps(d, _mm512_set1_ps(a.d[(m0 + r) * w.nb + block])),
                             acc[r]);
    if constexpr (FOLD) {
      acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a.s[(m0 + r) * w.ng + g]), acc[r]);
    }
    h[r] = l[r] = _mm512_setzero_si512();
  }
}

// One group of 16 interleaved weight rows against MT activation rows: lane r of every vector is
// weight row 16 grp + r; 4-byte runs of the activations' int8 halves are broadcast. KIND: 4, 5
// or 6 (nibbles plus KIND - 4 high planes), 8 (a byte per weight). G16: scales per 16 inputs
// (Q6_K: each half of a run's 8 runs is a group). STREAM: the outputs go out with
// non-temporal stores (see linear_groups_vnni).
template <int MT, int KIND, bool G16, bool STREAM>
void group_vnni(const Weights& w, int64_t grp, const QuantActs& a, int64_t m0, float* out[MT]) {
  const uint8_t* gq = w.q + grp * kRows * w.row_bytes;
  const int64_t k = w.k;
  constexpr int H = KIND == 8 ? 0 : KIND - 4;
  constexpr bool FOLD = KIND != 8;
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  // 64-input chunk c (blocks 2c and 2c+1), 8 runs of 16 rows x 4 bytes. Nibbles: the low
  // nibbles of run j are block 2c, the high ones block 2c+1. A byte a weight: runs 16c + j
  // and 16c + 8 + j.
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t c = 0; c < k / 64; ++c) {
    const uint8_t* cq = KIND == 8 ? gq + c * 1024 : gq + c * (512 + 128 * H);
    __m512i h0[MT], l0[MT], h1[MT], l1[MT];
    for (int r = 0; r < MT; ++r) h0[r] = l0[r] = h1[r] = l1[r] = _mm512_setzero_si512();
    // Unrolled: as a loop, gcc 12 gave every accumulator a different register in each
    // iteration and copied all 16 of them around the back edge (16 zmm moves per 16
    // vpdpbusd; 3072x576 at M = 32 0.73 -> 0.61 ms, one thread).
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512i u0, u1;
      if constexpr (KIND == 8) {
        u0 = _mm512_loadu_si512(cq + j * 64);
        u1 = _mm512_loadu_si512(cq + (8 + j) * 64);
      } else {
        const __m512i p = _mm512_loadu_si512(cq + j * 64);
        u0 = _mm512_and_si512(p, low4);
        u1 = _mm512_and_si512(_mm512_srli_epi16(p, 4), low4);
        if constexpr (H > 0) {
          switch (j) {  // constant after the unroll: the shifts are immediates
            case 0: add_high_run<H, 0>(u0, u1, cq); break;
            case 1: add_high_run<H, 1>(u0, u1, cq); break;
            case 2: add_high_run<H, 2>(u0, u1, cq); break;
            case 3: add_high_run<H, 3>(u0, u1, cq); break;
            case 4: add_high_run<H, 4>(u0, u1, cq); break;
            case 5: add_high_run<H, 5>(u0, u1, cq); break;
            case 6: add_high_run<H, 6>(u0, u1, cq); break;
            default: add_high_run<H, 7>(u0, u1, cq); break;
          }
        }
      }
      for (int r = 0; r < MT; ++r) {
        const int64_t off = (m0 + r) * k + c * 64 + 4 * j;
        dpbusd_bcst(h0[r], u0, a.hi.data() + off);
        dpbusd_bcst(l0[r], u0, a.lo.data() + off);
        dpbusd_bcst(h1[r], u1, a.hi.data() + off + 32);
        dpbusd_bcst(l1[r], u1, a.lo.data() + off + 32);
      }
      if (G16 && (j == 3 || j == 7)) {  // the end of a 16-input group in both blocks
        const int64_t half = j / 4;
        flush<MT, FOLD>(w, grp, 4 * c + half, acc, h0, l0, a, m0, 2 * c);
        flush<MT, FOLD>(w, grp, 4 * c + 2 + half, acc, h1, l1, a, m0, 2 * c + 1);
      }
    }
    if constexpr (!G16) {
      flush<MT, FOLD>(w, grp, 2 * c, acc, h0, l0, a, m0, 2 * c);
      flush<MT, FOLD>(w, grp, 2 * c + 1, acc, h1, l1, a, m0, 2 * c + 1);
    }
  }
  for (int64_t g = 0; !FOLD && g < w.ng; ++g) {  // the m-terms, where not folded
    const __m512 mv = group_m(w, grp, g);
    for (int r = 0; r < MT; ++r) {
      acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a.s[(m0 + r) * w.ng + g]), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) {
    if constexpr (STREAM) {
      _mm512_stream_ps(out[r] + grp * kRows, acc[r]);
    } else {
      _mm512_storeu_ps(out[r] + grp * kRows, acc[r]);
    }
  }
}

constexpr int kGroupTile = 4;  // activation rows per pass over a group (registers: 5 per row)

template <int KIND, bool G16, bool STREAM>
void run_groups(const Weights& w, const QuantActs& a, int64_t m, int64_t n, float* op,
            int64_t begin, int64_t end) {
  const int64_t group_bytes = kRows * w.row_bytes;
  const int64_t tiles = (m + kGroupTile - 1) / kGroupTile;
  const int64_t per_tile = (group_bytes / 64 + tiles - 1) / tiles * 64;
  const int64_t float_bytes = w.ng * kRows * (w.half ? 2 : 4);
  const int64_t scale_bytes[2] = {w.two_level ? w.sstride : float_bytes,
                                  w.two_level ? w.ng * kRows : float_bytes};
  for (int64_t g = begin; g < end; ++g) {
    const char* next = reinterpret_cast<const char*>(w.q + (g + 1) * group_bytes);
    for (int64_t m0 = 0; m0 < m; m0 += kGroupTile) {
      // The next group's weights, a share per tile: after the first tile re-reads this
      // group's weights from L1, so the hardware prefetcher no longer runs ahead and the next
      // group's first pass would wait on DRAM line by line.
      if (tiles > 1 && g + 1 < end) {  // (one tile streams: the hardware prefetcher keeps up)
        const int64_t lo = (m0 / kGroupTile) * per_tile;
        const int64_t hi = std::min(group_bytes, lo + per_tile);
        for (int64_t b = lo; b < hi; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
        if (m0 == 0) {  // and its scales and mins (the same pattern)
          const void* bases[2] = {w.d, w.m};
          for (int i = 0; i < 2; ++i) {
            if (bases[i] == nullptr) continue;
            const char* sp = static_cast<const char*>(bases[i]) + (g + 1) * scale_bytes[i];
            for (int64_t b = 0; b < scale_bytes[i]; b += 64) _mm_prefetch(sp + b, _MM_HINT_T0);
          }
        }
      }
      const int mt = static_cast<int>(std::min<int64_t>(kGroupTile, m - m0));
      float* rows_out[kGroupTile];
      for (int r = 0; r < mt; ++r) rows_out[r] = op + (m0 + r) * n;
      switch (mt) {
        case 4: group_vnni<4, KIND, G16, STREAM>(w, g, a, m0, rows_out); break;
        case 3: group_vnni<3, KIND, G16, STREAM>(w, g, a, m0, rows_out); break;
        case 2: group_vnni<2, KIND, G16, STREAM>(w, g, a, m0, rows_out); break;
        default: group_vnni<1, KIND, G16, STREAM>(w, g, a, m0, rows_out); break;
      }
    }
  }
}

template <bool STREAM>
void dispatch(const Weights& w, const QuantActs& a, int64_t m, int64_t n, float* op,
              int64_t begin, int64_t end) {
  const bool g16 = w.group != kBlock;
  switch (w.store_bits) {
    case 4:
      if (g16) return run_groups<4, true, STREAM>(w, a, m, n, op, begin, end);
      return run_groups<4, false, STREAM>(w, a, m, n, op, begin, end);
    case 5:
      if (g16) return run_groups<5, true, STREAM>(w, a, m, n, op, begin, end);
      return run_groups<5, false, STREAM>(w, a, m, n, op, begin, end);
    case 6:
      if (g16) return run_groups<6, true, STREAM>(w, a, m, n, op, begin, end);
      return run_groups<6, false, STREAM>(w, a, m, n, op, begin, end);
    default:  // 8 bits
      if (g16) return run_groups<8, true, STREAM>(w, a, m, n, op, begin, end);
      return run_groups<8, false, STREAM>(w, a, m, n, op, begin, end);
  }
}

}  // namespace

void linear_groups_vnni(const Weights& w, const QuantActs& a, int64_t m, int64_t n, float* op) {
  const int64_t groups = n / kRows;
  const int64_t grain =
      std::max<int64_t>(1, 32768 / (kRows * w.k * std::min<int64_t>(m, kGroupTile)));
  // A large output (an LM head's logits at batch 32: 6 MB) is written with non-temporal
  // stores: each pass writes 64 bytes to each of m rows n floats apart, and with n = 49152
  // those lines fall in 2 of L2's sets, so ordinary stores evicted each other and every one
  // waited for its line from DRAM (49152x576 at M = 32: 24 ms instead of ~11).
  const bool stream = m * n * static_cast<int64_t>(sizeof(float)) >= (int64_t{1} << 20) &&
                      reinterpret_cast<uintptr_t>(op) % 64 == 0;
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    if (stream) {
      dispatch<true>(w, a, m, n, op, begin, end);
      _mm_sfence();  // the streamed lines are visible before the pool's join
    } else {
      dispatch<false>(w, a, m, n, op, begin, end);
    }
  });
}

}  // namespace quant
}  // namespace octavo_cpu

#endif
