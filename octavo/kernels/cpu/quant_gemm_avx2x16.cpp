// The AVX2 kernel on weights interleaved by 16 rows (layout: quant_gemm.h), for CPUs without
// AVX-512 VNNI (AVX-512 masked by a hypervisor, client CPUs): the same layout and bytes as the
// VNNI kernel, so a model loads one way on every x86 CPU.
//
// Lane r of a ymm is weight row 8 h + r of the group's half h (a 64-byte run is two ymm: rows
// 0-7, then 8-15), and 4-byte runs of the activations are broadcast. Every product is exact
// and every dot of a group the same integer as the VNNI kernel's:
// - Nibble weights (4, 5, 6 bits) against the activations' int8 halves q = 256 hi + lo:
//   vpmaddubsw (u8 x s8, pairs summed to int16) into int16 accumulators, widened to int32 by
//   vpmaddwd (x 256 for hi) every W runs, W the most runs whose sums cannot saturate: a pair
//   is at most 2 (2^bits - 1) 128, so 8 runs at 4 bits, 4 at 5, 2 at 6.
// - Bytes (8 bits; vpmaddubsw would saturate) against q in pair order (quant_gemm.h:
//   inputs 4j, 4j+2, 4j+1, 4j+3 of every 4): each weight vector's even and odd bytes as 16-bit
//   words (an and, a shift) meet one broadcast dword of pairs each in vpmaddwd.

#include "quant_gemm.h"

#if defined(OCTAVO_QUANT_AVX2X16)

namespace octavo_cpu {
namespace quant {
namespace {

#define OCTAVO_AI inline __attribute__((always_inline))
#define OCTAVO_AI_LAMBDA __attribute__((always_inline))

OCTAVO_AI __m256 half8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The d of rows 8 hf ... 8 hf + 7 of group g, 16-row group grp: float scales, or (two-level)
// the integer scale times the float16 super-block d (exact in float32).
OCTAVO_AI __m256 group_d8(const Weights& w, int64_t grp, int64_t g, int hf) {
  if (w.two_level) {
    const __m128i sub = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(
        static_cast<const uint8_t*>(w.d) + grp * w.sstride + g * kRows + 8 * hf));
    const __m256i si = w.two_level == 1 ? _mm256_cvtepu8_epi32(sub) : _mm256_cvtepi8_epi32(sub);
    return _mm256_mul_ps(half8(w.super16(grp, g, 0) + 8 * hf), _mm256_cvtepi32_ps(si));
  }
  const int64_t idx = (grp * w.ng + g) * kRows + 8 * hf;
  if (w.half) return half8(static_cast<const c10::Half*>(w.d) + idx);
  return _mm256_loadu_ps(static_cast<const float*>(w.d) + idx);
}

// ... and their m, given their d (an implicit m is a multiple of it).
OCTAVO_AI __m256 group_m8(const Weights& w, int64_t grp, int64_t g, int hf, __m256 d) {
  if (w.implicit_m) return _mm256_mul_ps(d, _mm256_set1_ps(w.min_factor()));
  if (w.two_level) {
    const __m128i mn = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(
        static_cast<const uint8_t*>(w.m) + (grp * w.ng + g) * kRows + 8 * hf));
    const __m256 dmin = half8(w.super16(grp, g, 1) + 8 * hf);
    return _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), dmin),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
  }
  const int64_t idx = (grp * w.ng + g) * kRows + 8 * hf;
  if (w.half) return half8(static_cast<const c10::Half*>(w.m) + idx);
  return _mm256_loadu_ps(static_cast<const float*>(w.m) + idx);
}

// The activations' arrays as plain pointers: the kernels copy this and the Weights into locals,
// since a store of a vector (declared may_alias) would otherwise make gcc reload every field
// after each one.
struct Acts {
  const int16_t* q;
  const int8_t* hi;
  const int8_t* lo;
  const float* d;
  const float* s;
};

// Weight group g's share for MT activation rows: acc[r] += dot * d * xd + m * sum(x over g),
// the integer dots then cleared.
template <int MT>
OCTAVO_AI void flush(const Weights& w, int64_t grp, int64_t g, int hf, __m256 acc[MT],
                     __m256i dot[MT], const Acts& a, int64_t m0, int64_t block) {
  const __m256 d = group_d8(w, grp, g, hf);
  const __m256 mv = group_m8(w, grp, g, hf, d);
  for (int r = 0; r < MT; ++r) {
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]),
                             _mm256_mul_ps(d, _mm256_set1_ps(a.d[(m0 + r) * w.nb + block])),
                             acc[r]);
    acc[r] = _mm256_fmadd_ps(mv, _mm256_set1_ps(a.s[(m0 + r) * w.ng + g]), acc[r]);
    dot[r] = _mm256_setzero_si256();
  }
}

// u | (the H-bit field at bit SHIFT of each byte of hv, moved to bits 4..).
template <int H, int SHIFT>
OCTAVO_AI __m256i add_high(__m256i u, __m256i hv) {
  const __m256i field = _mm256_set1_epi8(static_cast<char>(((1 << H) - 1) << 4));
  __m256i t = hv;
  if constexpr (SHIFT < 4) t = _mm256_slli_epi16(hv, 4 - SHIFT);
  if constexpr (SHIFT > 4) t = _mm256_srli_epi16(hv, SHIFT - 4);
  return _mm256_or_si256(u, _mm256_and_si256(t, field));
}

// Run J's two vectors with their high bits (cq: this half's chunk base).
template <int H, int J>
OCTAVO_AI void add_high_run(__m256i& u0, __m256i& u1, const uint8_t* cq) {
  constexpr int per = 4 / H, v0 = 2 * (J % per);
  const __m256i hv =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cq + 512 + (J / per) * 64));
  u0 = add_high<H, H * v0>(u0, hv);
  u1 = add_high<H, H * (v0 + 1)>(u1, hv);
}

// add_high_run for a run index j that is constant once the caller's loop is unrolled (the
// switch folds away and the shifts stay immediates).
template <int H>
OCTAVO_AI void add_high_j(int j, __m256i& u0, __m256i& u1, const uint8_t* cq) {
  switch (j) {
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

// dot += u (8 lanes x 4 weight bytes) . the 4 pair-ordered activations at x (8-bit weights).
OCTAVO_AI void dot4_pairs(__m256i& dot, __m256i u, const int16_t* x) {
  const __m256i even = _mm256_and_si256(u, _mm256_set1_epi16(0x00FF));
  const __m256i odd = _mm256_srli_epi16(u, 8);
  int32_t e, o;
  std::memcpy(&e, x, 4);
  std::memcpy(&o, x + 2, 4);
  dot = _mm256_add_epi32(dot, _mm256_madd_epi16(even, _mm256_set1_epi32(e)));
  dot = _mm256_add_epi32(dot, _mm256_madd_epi16(odd, _mm256_set1_epi32(o)));
}

// Pins v in a register here: without it gcc reassociates a chunk's 32 integer accumulations
// into a tree after all the products, keeping ~20 products live and spilling them to the stack
// (Q4_K 8960x1536 from L3, one thread: 508 -> 427 us).
OCTAVO_AI void keep(__m256i& v) { asm("" : "+x"(v)); }

OCTAVO_AI __m256i bcast4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm256_set1_epi32(v);
}

// The bytes [off, off + n) of the next group into L2 (next: null for none), each half of this
// group's pass taking half of them, a share at every chunk. Reading this group's second half
// misses nothing (the first half brought its lines in), and the hardware prefetcher does not
// run ahead of a stream that stopped missing, so without this DRAM idled through every second
// half. From DRAM, two threads (2-core EPYC, alternated): Q4_K 8960x1536 404-408 -> 299-309
// us, Q6_K 1536x8960 670-706 -> 446-502 us; only in the second half 314-323 / 469-551;
// two groups ahead 308-316 / 525-540; into L1 (T0) slower than none.
OCTAVO_AI void prefetch_next(const uint8_t* next, int64_t off, int64_t n) {
  if (next == nullptr) return;
  for (int64_t b = 0; b < n; b += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(next + off + b), _MM_HINT_T1);
  }
}

// Half hf (rows 8 hf ... 8 hf + 7) of 16-row group grp against MT activation rows, 8-bit
// weights (G16: scales per 16 inputs).
template <int MT, bool G16>
void half_bytes(const Weights& wr, int64_t grp, int hf, const Acts& ar, int64_t m0,
                float* out[MT], const uint8_t* next) {
  const Weights w = wr;
  const Acts a = ar;
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  const uint8_t* gq = w.q + grp * kRows * w.row_bytes + 32 * hf;
  const int64_t k = w.k;
  for (int64_t c = 0; c < k / 64; ++c) {
    const uint8_t* cq = gq + c * 1024;
    prefetch_next(next, (hf * (k / 64) + c) * 512, 512);
    __m256i d0[MT], d1[MT];  // the int32 dots of blocks 2c and 2c + 1
    for (int r = 0; r < MT; ++r) d0[r] = d1[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cq + j * 64));
      const __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cq + (8 + j) * 64));
      for (int r = 0; r < MT; ++r) {
        const int16_t* x = a.q + (m0 + r) * k + c * 64 + 4 * j;
        dot4_pairs(d0[r], u0, x);
        dot4_pairs(d1[r], u1, x + 32);
        keep(d0[r]);
        keep(d1[r]);
      }
      if (G16 && (j == 3 || j == 7)) {  // the end of a 16-input group in both blocks
        flush<MT>(w, grp, 4 * c + j / 4, hf, acc, d0, a, m0, 2 * c);
        flush<MT>(w, grp, 4 * c + 2 + j / 4, hf, acc, d1, a, m0, 2 * c + 1);
      }
    }
    if constexpr (!G16) {
      flush<MT>(w, grp, 2 * c, hf, acc, d0, a, m0, 2 * c);
      flush<MT>(w, grp, 2 * c + 1, hf, acc, d1, a, m0, 2 * c + 1);
    }
  }
  for (int r = 0; r < MT; ++r) _mm256_storeu_ps(out[r] + grp * kRows + 8 * hf, acc[r]);
}

// d += 256 h + l (int16 pair sums to int32), h and l cleared.
OCTAVO_AI void widen(__m256i& d, __m256i& h, __m256i& l) {
  d = _mm256_add_epi32(d, _mm256_add_epi32(_mm256_madd_epi16(h, _mm256_set1_epi16(256)),
                                           _mm256_madd_epi16(l, _mm256_set1_epi16(1))));
  h = l = _mm256_setzero_si256();
}

// Two-level scales (TWO = Weights::two_level: 1 uint8 scales and mins, 2 int8 scales and
// m = min_factor d): group g's share goes into the super-block's sums in units of its float16
// d_super / dmin, s_acc += dot * xd * scale and m_acc += min * sum(x over g) (min: the
// scale itself for TWO = 2), and super_flush applies d_super and -dmin (or min_factor d_super)
// once per 256 inputs: 10 operations a group and row instead of 17.
template <int MT, int TWO>
OCTAVO_AI void flush_two(const Weights& w, int64_t grp, int64_t g, int hf, __m256 s_acc[MT],
                         __m256 m_acc[MT], __m256i dot[MT], const Acts& a, int64_t m0,
                         int64_t block) {
  const __m128i sub = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(
      static_cast<const uint8_t*>(w.d) + grp * w.sstride + g * kRows + 8 * hf));
  const __m256 sc = _mm256_cvtepi32_ps(TWO == 1 ? _mm256_cvtepu8_epi32(sub)
                                                : _mm256_cvtepi8_epi32(sub));
  __m256 mn = sc;
  if constexpr (TWO == 1) {
    mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(
        static_cast<const uint8_t*>(w.m) + (grp * w.ng + g) * kRows + 8 * hf))));
  }
  for (int r = 0; r < MT; ++r) {
    const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[r]),
                                   _mm256_set1_ps(a.d[(m0 + r) * w.nb + block]));
    s_acc[r] = _mm256_fmadd_ps(t, sc, s_acc[r]);
    m_acc[r] = _mm256_fmadd_ps(mn, _mm256_set1_ps(a.s[(m0 + r) * w.ng + g]), m_acc[r]);
    dot[r] = _mm256_setzero_si256();
  }
}

// acc += d_super s_acc + (-dmin, or min_factor d_super) m_acc for the super-block holding
// group g; the sums cleared.
template <int MT, int TWO>
OCTAVO_AI void super_flush(const Weights& w, int64_t grp, int64_t g, int hf, __m256 acc[MT],
                           __m256 s_acc[MT], __m256 m_acc[MT]) {
  const __m256 dsup = half8(w.super16(grp, g, 0) + 8 * hf);
  const __m256 mfac = TWO == 1
      ? _mm256_sub_ps(_mm256_setzero_ps(), half8(w.super16(grp, g, 1) + 8 * hf))
      : _mm256_mul_ps(dsup, _mm256_set1_ps(w.min_factor()));
  for (int r = 0; r < MT; ++r) {
    acc[r] = _mm256_fmadd_ps(s_acc[r], dsup, acc[r]);
    acc[r] = _mm256_fmadd_ps(m_acc[r], mfac, acc[r]);
    s_acc[r] = m_acc[r] = _mm256_setzero_ps();
  }
}

// The same for nibble weights: KIND 4, 5 or 6 (nibbles plus KIND - 4 high planes); TWO as
// above, 0 for float scales.
template <int MT, int KIND, bool G16, int TWO>
void half_nibbles(const Weights& wr, int64_t grp, int hf, const Acts& ar, int64_t m0,
                float* out[MT], const uint8_t* next) {
  const Weights w = wr;
  const Acts a = ar;
  __m256 acc[MT], s_acc[MT], m_acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = s_acc[r] = m_acc[r] = _mm256_setzero_ps();
  // a group's share of the sums: the float or the two-level flush
  auto share = [&](int64_t g, __m256i dot[MT], int64_t block) OCTAVO_AI_LAMBDA {
    if constexpr (TWO == 0) {
      flush<MT>(w, grp, g, hf, acc, dot, a, m0, block);
    } else {
      flush_two<MT, TWO>(w, grp, g, hf, s_acc, m_acc, dot, a, m0, block);
    }
  };
  const uint8_t* gq = w.q + grp * kRows * w.row_bytes + 32 * hf;
  const int64_t k = w.k;
  constexpr int H = KIND - 4;
  constexpr int W = KIND == 4 ? 8 : KIND == 5 ? 4 : 2;  // runs per widening (see the top)
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t c = 0; c < k / 64; ++c) {
    const uint8_t* cq = gq + c * (512 + 128 * H);
    prefetch_next(next, (hf * (k / 64) + c) * (256 + 64 * H), 256 + 64 * H);
    __m256i d0[MT], d1[MT];  // the int32 dots of blocks 2c and 2c + 1
    __m256i h0[MT], l0[MT], h1[MT], l1[MT];  // their int16 pair sums, hi and lo
    for (int r = 0; r < MT; ++r) {
      d0[r] = d1[r] = h0[r] = l0[r] = h1[r] = l1[r] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cq + j * 64));
      __m256i u0 = _mm256_and_si256(p, low4);
      __m256i u1 = _mm256_and_si256(_mm256_srli_epi16(p, 4), low4);
      if constexpr (H > 0) add_high_j<H>(j, u0, u1, cq);
      for (int r = 0; r < MT; ++r) {
        const int64_t off = (m0 + r) * k + c * 64 + 4 * j;
        h0[r] = _mm256_add_epi16(h0[r], _mm256_maddubs_epi16(u0, bcast4(a.hi + off)));
        l0[r] = _mm256_add_epi16(l0[r], _mm256_maddubs_epi16(u0, bcast4(a.lo + off)));
        h1[r] = _mm256_add_epi16(h1[r],
                                 _mm256_maddubs_epi16(u1, bcast4(a.hi + off + 32)));
        l1[r] = _mm256_add_epi16(l1[r],
                                 _mm256_maddubs_epi16(u1, bcast4(a.lo + off + 32)));
        keep(h0[r]);
        keep(l0[r]);
        keep(h1[r]);
        keep(l1[r]);
      }
      const bool group_end = G16 && (j == 3 || j == 7);
      if ((j + 1) % W == 0 || group_end) {
        for (int r = 0; r < MT; ++r) {
          widen(d0[r], h0[r], l0[r]);
          widen(d1[r], h1[r], l1[r]);
        }
      }
      if (group_end) {  // the end of a 16-input group in both blocks
        share(4 * c + j / 4, d0, 2 * c);
        share(4 * c + 2 + j / 4, d1, 2 * c + 1);
      }
    }
    if constexpr (!G16) {
      share(2 * c, d0, 2 * c);
      share(2 * c + 1, d1, 2 * c + 1);
    }
    if (TWO != 0 && c % 4 == 3) {  // the end of a 256-input super-block
      super_flush<MT, TWO>(w, grp, G16 ? 4 * c : 2 * c, hf, acc, s_acc, m_acc);
    }
  }
  for (int r = 0; r < MT; ++r) _mm256_storeu_ps(out[r] + grp * kRows + 8 * hf, acc[r]);
}

// One activation row (a decode step) against both halves of a 16-row group in one pass over
// its chunks: each 64-byte run is read whole (rows 0-7, then 8-15) and each broadcast
// activation serves both halves. Two passes of half a line each, as half_nibbles makes,
// streamed at ~19 GB/s on one thread where whole lines stream at ~35 (2-core EPYC, a plain
// read of 512 MB). The same integer dots and float flushes as half_nibbles, per half.
template <int KIND, bool G16, int TWO>
void both_nibbles(const Weights& wr, int64_t grp, const Acts& ar, int64_t m0, float* out,
                  const uint8_t* next) {
  const Weights w = wr;
  const Acts a = ar;
  __m256 acc[2][1], s_acc[2][1], m_acc[2][1];
  for (int hf = 0; hf < 2; ++hf) acc[hf][0] = s_acc[hf][0] = m_acc[hf][0] = _mm256_setzero_ps();
  auto share = [&](int hf, int64_t g, __m256i dot[1], int64_t block) OCTAVO_AI_LAMBDA {
    if constexpr (TWO == 0) {
      flush<1>(w, grp, g, hf, acc[hf], dot, a, m0, block);
    } else {
      flush_two<1, TWO>(w, grp, g, hf, s_acc[hf], m_acc[hf], dot, a, m0, block);
    }
  };
  const uint8_t* gq = w.q + grp * kRows * w.row_bytes;
  const int64_t k = w.k;
  constexpr int H = KIND - 4;
  constexpr int W = KIND == 4 ? 8 : KIND == 5 ? 4 : 2;  // runs per widening (see the top)
  constexpr int64_t chunk = 512 + 128 * H;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const int8_t* hi = a.hi + m0 * k;
  const int8_t* lo = a.lo + m0 * k;
  for (int64_t c = 0; c < k / 64; ++c) {
    const uint8_t* cq = gq + c * chunk;
    prefetch_next(next, c * chunk, chunk);
    // [half][block 2c, 2c + 1]: int32 dots, and their int16 pair sums hi and lo
    __m256i d[2][2][1], h[2][2], l[2][2];
    for (int hf = 0; hf < 2; ++hf) {
      for (int b = 0; b < 2; ++b) {
        d[hf][b][0] = h[hf][b] = l[hf][b] = _mm256_setzero_si256();
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const int64_t off = c * 64 + 4 * j;
      for (int hf = 0; hf < 2; ++hf) {
        const __m256i p =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cq + j * 64 + 32 * hf));
        __m256i u0 = _mm256_and_si256(p, low4);
        __m256i u1 = _mm256_and_si256(_mm256_srli_epi16(p, 4), low4);
        if constexpr (H > 0) add_high_j<H>(j, u0, u1, cq + 32 * hf);
        h[hf][0] = _mm256_add_epi16(h[hf][0], _mm256_maddubs_epi16(u0, bcast4(hi + off)));
        l[hf][0] = _mm256_add_epi16(l[hf][0], _mm256_maddubs_epi16(u0, bcast4(lo + off)));
        h[hf][1] = _mm256_add_epi16(h[hf][1], _mm256_maddubs_epi16(u1, bcast4(hi + off + 32)));
        l[hf][1] = _mm256_add_epi16(l[hf][1], _mm256_maddubs_epi16(u1, bcast4(lo + off + 32)));
        keep(h[hf][0]);
        keep(l[hf][0]);
        keep(h[hf][1]);
        keep(l[hf][1]);
      }
      const bool group_end = G16 && (j == 3 || j == 7);
      if ((j + 1) % W == 0 || group_end) {
        for (int hf = 0; hf < 2; ++hf) {
          widen(d[hf][0][0], h[hf][0], l[hf][0]);
          widen(d[hf][1][0], h[hf][1], l[hf][1]);
        }
      }
      if (group_end) {  // the end of a 16-input group in both blocks
        for (int hf = 0; hf < 2; ++hf) {
          share(hf, 4 * c + j / 4, d[hf][0], 2 * c);
          share(hf, 4 * c + 2 + j / 4, d[hf][1], 2 * c + 1);
        }
      }
    }
    if constexpr (!G16) {
      for (int hf = 0; hf < 2; ++hf) {
        share(hf, 2 * c, d[hf][0], 2 * c);
        share(hf, 2 * c + 1, d[hf][1], 2 * c + 1);
      }
    }
    if (TWO != 0 && c % 4 == 3) {  // the end of a 256-input super-block
      for (int hf = 0; hf < 2; ++hf) {
        super_flush<1, TWO>(w, grp, G16 ? 4 * c : 2 * c, hf, acc[hf], s_acc[hf], m_acc[hf]);
      }
    }
  }
  for (int hf = 0; hf < 2; ++hf) _mm256_storeu_ps(out + grp * kRows + 8 * hf, acc[hf][0]);
}

// The same for 8-bit weights (half_bytes' dots, both halves a pass).
template <bool G16>
void both_bytes(const Weights& wr, int64_t grp, const Acts& ar, int64_t m0, float* out,
                const uint8_t* next) {
  const Weights w = wr;
  const Acts a = ar;
  __m256 acc[2][1];
  acc[0][0] = acc[1][0] = _mm256_setzero_ps();
  const uint8_t* gq = w.q + grp * kRows * w.row_bytes;
  const int64_t k = w.k;
  const int16_t* xq = a.q + m0 * k;
  for (int64_t c = 0; c < k / 64; ++c) {
    const uint8_t* cq = gq + c * 1024;
    prefetch_next(next, c * 1024, 1024);
    __m256i d[2][2][1];  // [half][block 2c, 2c + 1]
    for (int hf = 0; hf < 2; ++hf) d[hf][0][0] = d[hf][1][0] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const int16_t* x = xq + c * 64 + 4 * j;
      for (int hf = 0; hf < 2; ++hf) {
        const __m256i u0 =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cq + j * 64 + 32 * hf));
        const __m256i u1 =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cq + (8 + j) * 64 + 32 * hf));
        dot4_pairs(d[hf][0][0], u0, x);
        dot4_pairs(d[hf][1][0], u1, x + 32);
        keep(d[hf][0][0]);
        keep(d[hf][1][0]);
      }
      if (G16 && (j == 3 || j == 7)) {  // the end of a 16-input group in both blocks
        for (int hf = 0; hf < 2; ++hf) {
          flush<1>(w, grp, 4 * c + j / 4, hf, acc[hf], d[hf][0], a, m0, 2 * c);
          flush<1>(w, grp, 4 * c + 2 + j / 4, hf, acc[hf], d[hf][1], a, m0, 2 * c + 1);
        }
      }
    }
    if constexpr (!G16) {
      for (int hf = 0; hf < 2; ++hf) {
        flush<1>(w, grp, 2 * c, hf, acc[hf], d[hf][0], a, m0, 2 * c);
        flush<1>(w, grp, 2 * c + 1, hf, acc[hf], d[hf][1], a, m0, 2 * c + 1);
      }
    }
  }
  for (int hf = 0; hf < 2; ++hf) _mm256_storeu_ps(out + grp * kRows + 8 * hf, acc[hf][0]);
}

// next: the next group's weights, prefetched along the way (null: none). One activation row
// takes both halves a pass (both_nibbles, both_bytes); more take one half a pass, which holds
// a tile's accumulators in the 16 registers.
template <int MT, int KIND, bool G16, int TWO>
void group_avx2(const Weights& w, int64_t grp, const Acts& a, int64_t m0, float* out[MT],
                const uint8_t* next) {
  if constexpr (MT == 1) {  // both halves in one pass
    if constexpr (KIND == 8) {
      both_bytes<G16>(w, grp, a, m0, out[0], next);
    } else {
      both_nibbles<KIND, G16, TWO>(w, grp, a, m0, out[0], next);
    }
  } else {
    for (int hf = 0; hf < 2; ++hf) {
      if constexpr (KIND == 8) {
        half_bytes<MT, G16>(w, grp, hf, a, m0, out, next);
      } else {
        half_nibbles<MT, KIND, G16, TWO>(w, grp, hf, a, m0, out, next);
      }
    }
  }
}

// Activation rows per pass over a group (up to 7 accumulators a row, in 16 ymm registers).
constexpr int kTileAvx2 = 2;

template <int KIND, bool G16, int TWO = 0>
void run_groups(const Weights& w, const Acts& a, int64_t m, int64_t n, float* op,
                int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; ++g) {
    for (int64_t m0 = 0; m0 < m; m0 += kTileAvx2) {
      float* rows_out[kTileAvx2];
      const int mt = static_cast<int>(std::min<int64_t>(kTileAvx2, m - m0));
      for (int r = 0; r < mt; ++r) rows_out[r] = op + (m0 + r) * n;
      // the next group once, on the last tile's pass
      const uint8_t* next = g + 1 < end && m0 + kTileAvx2 >= m
                                ? w.q + (g + 1) * kRows * w.row_bytes : nullptr;
      if (mt == 2) {
        group_avx2<2, KIND, G16, TWO>(w, g, a, m0, rows_out, next);
      } else {
        group_avx2<1, KIND, G16, TWO>(w, g, a, m0, rows_out, next);
      }
    }
  }
}

void dispatch(const Weights& w, const Acts& a, int64_t m, int64_t n, float* op,
              int64_t begin, int64_t end) {
  const bool g16 = w.group != kBlock;
  // The K-quants' own combinations take the two-level flush; any other two-level layout the
  // per-group one (group_d8 reads both kinds), so as not to build every combination.
  const int64_t bits = w.store_bits, two = w.two_level;
  if (two == 1 && bits == 4 && !g16) return run_groups<4, false, 1>(w, a, m, n, op, begin, end);
  if (two == 1 && bits == 5 && !g16) return run_groups<5, false, 1>(w, a, m, n, op, begin, end);
  if (two == 2 && bits == 6 && g16) return run_groups<6, true, 2>(w, a, m, n, op, begin, end);
  switch (w.store_bits) {
    case 4:
      if (g16) return run_groups<4, true>(w, a, m, n, op, begin, end);
      return run_groups<4, false>(w, a, m, n, op, begin, end);
    case 5:
      if (g16) return run_groups<5, true>(w, a, m, n, op, begin, end);
      return run_groups<5, false>(w, a, m, n, op, begin, end);
    case 6:
      if (g16) return run_groups<6, true>(w, a, m, n, op, begin, end);
      return run_groups<6, false>(w, a, m, n, op, begin, end);
    default:  // 8 bits
      if (g16) return run_groups<8, true>(w, a, m, n, op, begin, end);
      return run_groups<8, false>(w, a, m, n, op, begin, end);
  }
}

}  // namespace

void linear_groups_avx2(const Weights& w, const QuantActs& a, int64_t m, int64_t n, float* op) {
  const int64_t groups = n / kRows;
  const int64_t grain =
      std::max<int64_t>(1, 32768 / (kRows * w.k * std::min<int64_t>(m, kTileAvx2)));
  const Acts acts{a.q.data(), a.hi.data(), a.lo.data(), a.d.data(), a.s.data()};
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    dispatch(w, acts, m, n, op, begin, end);
  });
}

}  // namespace quant
}  // namespace octavo_cpu

#endif
