// Decode attention over the paged KV cache (one new token per request) on mma.sync, its K/V
// tiles streamed into shared memory by cp.async several tiles ahead. octavo/kernels/
// paged_decode.py plans the launch, says when it runs instead of the Triton kernel, and why.
//
// A CTA owns one (request, KV head, part of the context); its W warps take the part's
// 16-token tiles in turn (warp w: tiles w, w + W, ...), each with its own online softmax,
// merged through shared memory at the end. Rows of every product are the GQA group's query
// heads (row g and g + 8 of the m16n8k16 tile: up to 16 heads), so a K/V tile read once
// feeds the whole group.
//
// Per 16-token tile, lane (g = lane / 4, t = lane % 4):
//  * S^T [heads x tokens] = q [heads x D] K^T: B operand = K of token g (n8 tile 0) and
//    token 8 + g (tile 1), 16 bytes at dims 32 i + 8 t of each 32-wide step i. The order of
//    the K dimension inside a step is free (the sum does not care) so each 16-byte load is
//    two operand registers as it stands; q is loaded the same way once.
//  * The C fragments of S^T are the A fragments of P (rows = heads, K = the 16 tokens):
//    no shuffles between the products.
//  * O [heads x D] += P V: B operand = V [tokens x dims] with two tokens of one dim per
//    register: the lane loads dims 64 c + 8 g + [0, 8) (c < D/64; the 8 lanes of a token
//    read whole 128-byte lines) of tokens 2t, 2t+1, 8+2t, 9+2t and pairs them with one PRMT
//    per register; output column n of dim tile j = 8 c + k is dim 64 c + 8 n + k.
// A warp copies its tiles in whole 256-byte rows (two per instruction) into its own ring of
// shared memory (swizzled, below) and synchronises only itself (cp.async.wait_group, then
// __syncwarp). Tokens past the part are zero-filled (src-size 0) and masked.

#include "mma_common.cuh"

namespace {

using octavo::pdl_wait;
using octavo::word;

constexpr float kNegBig = -1.0e30f;  // running max start: finite, so exp2(m - m_new) is 0 or 1

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (octavo::MmaType<T>::kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

struct Params {
  void* out;
  const void* q;
  const void* k_cache;
  const void* v_cache;
  const int* qsl;
  const int* seq_lens;
  const int* block_tables;
  float* part_o;   // [pairs, splits, group, D] unnormalised outputs of split parts
  float* part_ml;  // [pairs, splits, group, 2] their (max, sum)
  int* cnt;        // [pairs] tickets, left zeroed
  float qk_scale;  // softmax scale * log2(e)
  int q_t, q_h, o_t, o_h;
  int k_b, k_t, k_h, v_b, v_t, v_h;
  int bt_stride;
  int group;
  int block_size;
  int min_part;  // tokens: each request's parts are at least this long (a multiple of 16)
  int flags;     // measurement switches: 1 = loads only (no arithmetic), 4 = one CTA per
                 // request and part with a warp per KV head (blockDim = 32 x KV heads)
};

template <typename T, int D, int STAGES, bool BIG>
__device__ __forceinline__ void paged_decode(const Params& p) {
  constexpr int KS = D / 32;     // 16-byte K operand pieces per token row per lane
  constexpr int VS = D / 64;     // 16-byte V operand pieces per token row per lane
  constexpr int NS = 2 * KS + 4 * VS;  // 512-byte units of one tile (K and V)
  constexpr int JD = D / 8;      // dim tiles of the PV product
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float sm_m[octavo::kMaxWarps][16];
  __shared__ float sm_l[octavo::kMaxWarps][16];
  __shared__ int sm_last;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  // A CTA holds hc KV heads (one, or every head with flag 4), wph warps each.
  const int hc = (p.flags & 4) ? warps : 1;
  const int wph = warps / hc;
  const int head0 = blockIdx.y * hc;
  const int hw = warp / wph;  // this warp's head in the CTA
  const int wi = warp % wph;  // and its place among that head's warps
  const int b = blockIdx.x;
  const int kvh = head0 + hw;
  const int num_kv_heads = gridDim.y * hc;
  const int split = blockIdx.z;
  const int splits = gridDim.z;
  const int G = p.group;

  pdl_wait();
  const int q_start = p.qsl[b];  // the three loads in flight together
  const int q_end = p.qsl[b + 1];
  const int seq_len = p.seq_lens[b];
  if (q_end - q_start != 1) return;  // not a decode: the prefill launch takes it
  int part = (((seq_len + splits - 1) / splits + 15) / 16) * 16;
  part = max(part, p.min_part);
  const int used = (seq_len + part - 1) / part;
  if (split >= used) return;
  const int lo = split * part;
  const int hi = min(lo + part, seq_len);
  const int tiles = (hi - lo + 15) / 16;

  const T* __restrict__ kc = static_cast<const T*>(p.k_cache) + (size_t)kvh * p.k_h;
  const T* __restrict__ vc = static_cast<const T*>(p.v_cache) + (size_t)kvh * p.v_h;
  const int* __restrict__ bt = p.block_tables + (size_t)b * p.bt_stride;

  // q rows g and g + 8 (heads of the group; zeros past it), 16 bytes per 32-wide step.
  uint4 qa[KS], qb[KS];
  {
    const T* qrow = static_cast<const T*>(p.q) + (size_t)q_start * p.q_t;
#pragma unroll
    for (int i = 0; i < KS; ++i) {
      qa[i] = g < G ? *reinterpret_cast<const uint4*>(qrow + (size_t)(kvh * G + g) * p.q_h +
                                                      32 * i + 8 * t)
                    : make_uint4(0, 0, 0, 0);
      qb[i] = (BIG && g + 8 < G)
                  ? *reinterpret_cast<const uint4*>(qrow + (size_t)(kvh * G + g + 8) * p.q_h +
                                                    32 * i + 8 * t)
                  : make_uint4(0, 0, 0, 0);
    }
  }

  // This warp's ring: STAGES tiles, each K then V as 16 token rows of CH 16-byte chunks;
  // chunk c of row R sits at c ^ swizzle(R) (K: (R & 1) << 2, V: ((R >> 1) & 3) << 1), so
  // the copies (two whole rows per warp instruction) and the operand reads below (eight
  // lanes of distinct bank groups per phase) are free of bank conflicts.
  constexpr int CH = D / 8;           // chunks per row
  constexpr int ROWS_B = 16 * CH * 16;  // bytes of one tile's K (or V)
  constexpr int CP = 16 * CH / 32;    // copies per lane per tile, K (and V)
  unsigned char* ring = smem + (size_t)warp * STAGES * NS * 512;
  const uint32_t ring_addr = smem_addr(ring);
  const int count = wi < tiles ? (tiles - wi + wph - 1) / wph : 0;

  auto tile_start = [&](int it) { return lo + 16 * (wi + it * wph); };
  // Block ids 32 tiles at a time: lane l holds tile (32 n + l)'s; the next 32 are loaded a
  // batch ahead, so no copy waits on a block-table read.
  auto bids_of = [&](int batch) {
    const int it = 32 * batch + lane;
    return it < count ? __ldg(bt + tile_start(it) / p.block_size) : 0;
  };
  int bids_cur = bids_of(0);
  int bids_next = bids_of(1);
  // Copy tile it into stage s: lane copies chunks e = 32 q + lane (row e / CH, chunk e % CH).
  auto issue = [&](int it, int s) {
    if (it % 32 == 0 && it > 0) {
      bids_cur = bids_next;
      bids_next = bids_of(it / 32 + 1);
    }
    const int bid = __shfl_sync(0xffffffffu, bids_cur, it % 32);
    const int ts = tile_start(it);
    const int off = ts % p.block_size;
    const T* kb = kc + (size_t)bid * p.k_b + (size_t)off * p.k_t;
    const T* vb = vc + (size_t)bid * p.v_b + (size_t)off * p.v_t;
    const uint32_t base = ring_addr + (uint32_t)(s * NS * 512);
#pragma unroll
    for (int q = 0; q < CP; ++q) {
      const int e = 32 * q + lane;
      const int row = e / CH;
      const int c = e % CH;
      const bool ok = ts + row < hi;
      const int r = ok ? row : 0;
      cp_async16(base + (row * CH + (c ^ ((row & 1) << 2))) * 16, kb + (size_t)r * p.k_t + 8 * c,
                 ok);
      cp_async16(base + ROWS_B + (row * CH + (c ^ (((row >> 1) & 3) << 1))) * 16,
                 vb + (size_t)r * p.v_t + 8 * c, ok);
    }
  };
  // The lane's operand pieces: K of row 8 j + g, chunk 4 i + t; V of row
  // 2t + (r & 1) + 8 (r >> 1), chunk 8 c + g.
  auto k_at = [&](uint32_t stage, int j, int i) {
    const int row = 8 * j + g;
    return lds128(stage + (row * CH + ((4 * i + t) ^ ((row & 1) << 2))) * 16);
  };
  auto v_at = [&](uint32_t stage, int r, int c) {
    const int row = 2 * t + (r & 1) + 8 * (r >> 1);
    return lds128(stage + ROWS_B + (row * CH + ((8 * c + g) ^ (((row >> 1) & 3) << 1))) * 16);
  };

  float o[JD][4];
#pragma unroll
  for (int j = 0; j < JD; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = kNegBig, m1 = kNegBig, l0 = 0.f, l1 = 0.f;

  // Prologue: STAGES - 1 tiles in flight.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < count) issue(s, s);
    cp_async_commit();
  }

  for (int it = 0; it < count; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncwarp();  // the tile's chunks (copied by every lane) are visible to the warp, and
                   // the stage refilled next was read by every lane
    {
      const int ahead = it + STAGES - 1;
      if (ahead < count) issue(ahead, ahead % STAGES);
      cp_async_commit();
    }
    const uint32_t slot = ring_addr + (uint32_t)((it % STAGES) * NS * 512);
    const int ts = tile_start(it);
    if (p.flags & 1) {  // loads only: keep the words live so nothing is elided
      uint32_t x = 0;
#pragma unroll
      for (int i = 0; i < KS; ++i) x ^= k_at(slot, 0, i).x ^ k_at(slot, 1, i).y;
#pragma unroll
      for (int c = 0; c < VS; ++c) x ^= v_at(slot, 0, c).x ^ v_at(slot, 3, c).y;
      o[0][0] += __uint_as_float(x & 0x3f800000u);
      continue;
    }

    // S^T = q K^T for tokens 0-7 (s[0]) and 8-15 (s[1]); two chains each.
    float s[2][2][4] = {};
#pragma unroll
    for (int i = 0; i < KS; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint4 kv = k_at(slot, j, i);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          octavo::MmaType<T>::mma(s[j][i & 1], word(qa[i], 2 * h), word(qb[i], 2 * h),
                                  word(qa[i], 2 * h + 1), word(qb[i], 2 * h + 1),
                                  word(kv, 2 * h), word(kv, 2 * h + 1));
      }
    }
    float sc[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = ts + 8 * j + 2 * t + (i & 1);
        const float v = (s[j][0][i] + s[j][1][i]) * p.qk_scale;
        sc[j][i] = tok < hi ? v : -INFINITY;
      }
    }
    const float mx0 = quad_max(fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1])));
    const float mn0 = fmaxf(m0, mx0);
    float mn1 = m1;
    if constexpr (BIG) {
      const float mx1 = quad_max(fmaxf(fmaxf(sc[0][2], sc[0][3]), fmaxf(sc[1][2], sc[1][3])));
      mn1 = fmaxf(m1, mx1);
    }
    if (__any_sync(0xffffffffu, mn0 > m0 || mn1 > m1)) {
      const float a0 = fast_exp2(m0 - mn0);
      const float a1 = fast_exp2(m1 - mn1);
      l0 *= a0;
      l1 *= a1;
#pragma unroll
      for (int j = 0; j < JD; ++j) {
        o[j][0] *= a0;
        o[j][1] *= a0;
        if constexpr (BIG) {
          o[j][2] *= a1;
          o[j][3] *= a1;
        }
      }
      m0 = mn0;
      m1 = mn1;
    }
    float pr[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      pr[j][0] = fast_exp2(sc[j][0] - m0);
      pr[j][1] = fast_exp2(sc[j][1] - m0);
      l0 += pr[j][0] + pr[j][1];
      if constexpr (BIG) {
        pr[j][2] = fast_exp2(sc[j][2] - m1);
        pr[j][3] = fast_exp2(sc[j][3] - m1);
        l1 += pr[j][2] + pr[j][3];
      } else {
        pr[j][2] = pr[j][3] = 0.f;
      }
    }
    const uint32_t pa0 = pack2<T>(pr[0][0], pr[0][1]);
    const uint32_t pa1 = BIG ? pack2<T>(pr[0][2], pr[0][3]) : 0u;
    const uint32_t pa2 = pack2<T>(pr[1][0], pr[1][1]);
    const uint32_t pa3 = BIG ? pack2<T>(pr[1][2], pr[1][3]) : 0u;

    // O += P V: dim tile 8 c + 2 w + half is dim 64 c + 8 n + 2 w + half of column n.
#pragma unroll
    for (int c = 0; c < VS; ++c) {
      const uint4 v0 = v_at(slot, 0, c);
      const uint4 v1 = v_at(slot, 1, c);
      const uint4 v2 = v_at(slot, 2, c);
      const uint4 v3 = v_at(slot, 3, c);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint32_t sel = half ? 0x7632u : 0x5410u;
          const uint32_t b0 = prmt(word(v0, w), word(v1, w), sel);
          const uint32_t b1 = prmt(word(v2, w), word(v3, w), sel);
          octavo::MmaType<T>::mma(o[8 * c + 2 * w + half], pa0, pa1, pa2, pa3, b0, b1);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncwarp();  // every lane's copies landed and reads done before the ring is reused
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);

  // Merge the warps: each writes its O rows into its own ring's first stage.
  constexpr int RS = D + 4;  // row stride: the lanes' stores fall in different banks
  float* red = reinterpret_cast<float*>(ring);  // [16][RS]
#pragma unroll
  for (int j = 0; j < JD; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i >> 1);
      const int dim = 64 * (j >> 3) + 8 * (2 * t + (i & 1)) + (j & 7);
      if (BIG || i < 2) red[row * RS + dim] = o[j][i];
    }
  }
  if (t == 0) {
    sm_m[warp][g] = m0;
    sm_l[warp][g] = l0;
    sm_m[warp][g + 8] = m1;
    sm_l[warp][g + 8] = l1;
  }
  __syncthreads();

  const int cta = b * gridDim.y + blockIdx.y;  // the ticket counter of the CTA's heads
  const size_t ring_floats = (size_t)STAGES * NS * 128;  // floats per warp's ring
  const float* all = reinterpret_cast<const float*>(smem);
  T* out = static_cast<T*>(p.out);
  for (int e = threadIdx.x; e < hc * G * D; e += blockDim.x) {
    const int hh = e / (G * D);
    const int r = e / D - hh * G;
    const int d = e % D;
    const int head = head0 + hh;
    const size_t part_base = (((size_t)b * num_kv_heads + head) * splits + split) * G;
    float mx = kNegBig;
    for (int w = hh * wph; w < (hh + 1) * wph; ++w) mx = fmaxf(mx, sm_m[w][r]);
    float num = 0.f, den = 0.f;
    for (int w = hh * wph; w < (hh + 1) * wph; ++w) {
      const float a = fast_exp2(sm_m[w][r] - mx);
      num += a * all[w * ring_floats + r * RS + d];
      den += a * sm_l[w][r];
    }
    if (used == 1) {
      out[(size_t)q_start * p.o_t + (size_t)(head * G + r) * p.o_h + d] =
          octavo::MmaType<T>::from_float(num / den);
    } else {
      p.part_o[(part_base + r) * D + d] = num;
      if (d == 0) {
        p.part_ml[(part_base + r) * 2] = mx;
        p.part_ml[(part_base + r) * 2 + 1] = den;
      }
    }
  }
  if (used == 1) return;

  // The part that takes the pair's last ticket merges every part (in part order).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int ticket;
    asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(ticket) : "l"(p.cnt + cta) : "memory");
    sm_last = ticket == used - 1;
  }
  __syncthreads();
  if (!sm_last) return;
  __threadfence();
  for (int e = threadIdx.x; e < hc * G * D; e += blockDim.x) {
    const int hh = e / (G * D);
    const int r = e / D - hh * G;
    const int d = e % D;
    const int head = head0 + hh;
    const size_t pair_base = ((size_t)b * num_kv_heads + head) * splits * G;
    float mx = kNegBig;
    for (int sp = 0; sp < used; ++sp)
      mx = fmaxf(mx, __ldcg(p.part_ml + (pair_base + (size_t)sp * G + r) * 2));
    float num = 0.f, den = 0.f;
    for (int sp = 0; sp < used; ++sp) {
      const size_t row = pair_base + (size_t)sp * G + r;
      const float a = fast_exp2(__ldcg(p.part_ml + row * 2) - mx);
      num += a * __ldcg(p.part_o + row * D + d);
      den += a * __ldcg(p.part_ml + row * 2 + 1);
    }
    out[(size_t)q_start * p.o_t + (size_t)(head * G + r) * p.o_h + d] =
        octavo::MmaType<T>::from_float(num / den);
  }
  if (threadIdx.x == 0) atomicExch(p.cnt + cta, 0);
}

}  // namespace

#define OCTAVO_PAGED_DECODE(NAME, T, D, STAGES, BIG)                   \
  extern "C" __global__ void __launch_bounds__(256) NAME(const Params p) { \
    paged_decode<T, D, STAGES, BIG>(p);                                \
  }

// paged_decode_{bf16,f16}_d{64,128}_s{2,3,4,6,8}[_g16]
#define OCTAVO_PAGED_DECODE_GROUPS(TN, T, D, S)                        \
  OCTAVO_PAGED_DECODE(paged_decode_##TN##_d##D##_s##S, T, D, S, false) \
  OCTAVO_PAGED_DECODE(paged_decode_##TN##_d##D##_s##S##_g16, T, D, S, true)

#define OCTAVO_PAGED_DECODE_STAGES(TN, T, D)  \
  OCTAVO_PAGED_DECODE_GROUPS(TN, T, D, 2)     \
  OCTAVO_PAGED_DECODE_GROUPS(TN, T, D, 3)     \
  OCTAVO_PAGED_DECODE_GROUPS(TN, T, D, 4)     \
  OCTAVO_PAGED_DECODE_GROUPS(TN, T, D, 6)     \
  OCTAVO_PAGED_DECODE_GROUPS(TN, T, D, 8)

#define OCTAVO_PAGED_DECODE_DIMS(TN, T)       \
  OCTAVO_PAGED_DECODE_STAGES(TN, T, 64)       \
  OCTAVO_PAGED_DECODE_STAGES(TN, T, 128)

OCTAVO_PAGED_DECODE_DIMS(bf16, __nv_bfloat16)
OCTAVO_PAGED_DECODE_DIMS(f16, __half)
