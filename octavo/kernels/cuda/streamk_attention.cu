// Stream-K decode attention on mma.sync: the work list of octavo/kernels/
// paged_attention_streamk.py (decode_tiles, BLOCK_N = 16 WARPS keys a tile) walked by a grid
// of (P, KV heads) CTAs, each warp with its own cp.async ring of K / V in shared memory.
// octavo/kernels/streamk_cuda.py builds it, launches it and says why it exists.
//
// CTA (p, h) takes the walk's tiles [p per, min((p + 1) per, total)); warp w takes keys
// 16 w .. 16 w + 15 of each tile (one run of 16 rows inside one cache block: the block size is
// a multiple of 16 and divides BLOCK_N) and keeps its own online-softmax state for the
// request the tile belongs to. Rows are the GQA group's query heads (GROUP of the m16 rows;
// the others are zero queries: finite, never stored). Per 16 keys: S = Q K^T as two m16n8k16
// n-tiles over 8 k-steps (K rows read by ldmatrix), P = exp2(S - m) in the 16-bit type as
// the A operand of P V over D / 8 n-tiles (V by ldmatrix.trans). Shared memory rows are 16
// pieces of 16 bytes, piece p of row r stored at p ^ (r & 7): an 8-row ldmatrix hits 8
// distinct bank groups. A warp's ring is its own (no CTA barrier in the loop); the work
// list's entries for the copies are fetched a tile before they are needed.
//
// At a request's last tile (or the CTA's last) the warps' states meet in shared memory and
// the CTA writes the normalised output (the request whole in this CTA) or a partial (m, l,
// acc) in slot 0 (the request the CTA starts inside) or 1 (the one it ends inside); after
// the walk the last CTA to finish a cut request merges its pieces (ticket per request and
// KV head, counter left zeroed), as the Triton kernel does.

#include "mma_common.cuh"

namespace {

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const T a = octavo::MmaType<T>::from_float(lo), b = octavo::MmaType<T>::from_float(hi);
  return (uint32_t)*reinterpret_cast<const unsigned short*>(&a) |
         ((uint32_t)*reinterpret_cast<const unsigned short*>(&b) << 16);
}

constexpr int kKeysMask = 0xFFFF;
constexpr int kFirstBit = 16;
constexpr int kLastBit = 17;
constexpr float kNegBig = -1.0e30f;
#define OCTAVO_NEG_INF __int_as_float(0xff800000)

// Shared memory: WARPS rings of STAGES stages, each K then V of 16 keys (D / 8 pieces a
// row), then the merge area: [WARPS][GROUP][D] floats of acc and [WARPS][GROUP][2] of (m, l).
template <int D, int GROUP, int WARPS, int STAGES>
__host__ __device__ constexpr int shared_bytes() {
  return WARPS * STAGES * 2 * 16 * D * 2 + WARPS * GROUP * (D + 2) * 4;
}

template <typename T, int D, int GROUP, int WARPS, int STAGES>
__device__ __forceinline__ void streamk_attention(
    T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ kc,
    const T* __restrict__ vc, const int* __restrict__ cu, const int* __restrict__ order,
    const int* __restrict__ tile_tok, const int* __restrict__ tile_info,
    const int* __restrict__ tile_req, const int* __restrict__ tile_blocks,
    float* __restrict__ part_acc, float* __restrict__ part_ml, int* __restrict__ cnt,
    const int* __restrict__ qsl, float qk_scale, int num_seqs, int num_progs, int stride_qt,
    int stride_qh, int stride_ot, int stride_oh, int stride_kb, int stride_kt, int stride_kh,
    int stride_vb, int stride_vt, int stride_vh, int block_size) {
  using M = octavo::MmaType<T>;
  constexpr int BLOCK_N = 16 * WARPS;
  constexpr int ROW = D / 8;  // 16-byte pieces a key row
  constexpr int KV = 16 * ROW;  // pieces of 16 keys' K (or V)
  constexpr int ND = D / 8;  // n-tiles of P V
  static_assert(D % 16 == 0 && D <= 256 && GROUP >= 1 && GROUP <= 8, "shape");
  extern __shared__ uint4 smem[];
  __shared__ int ticket_s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int pid = blockIdx.x, kv_head = blockIdx.y, num_kv_heads = gridDim.y;
  const int bpt = BLOCK_N / block_size;  // cache blocks a tile covers
  const int my_blk = 16 * warp / block_size, my_off = 16 * warp % block_size;
  uint4* ring = smem + warp * STAGES * 2 * KV;
  float* macc = reinterpret_cast<float*>(smem + WARPS * STAGES * 2 * KV);
  float* mml = macc + WARPS * GROUP * D;

  octavo::pdl_wait();
  const int total = __ldg(cu + num_seqs);
  const int per = (total + num_progs - 1) / num_progs;
  const int t0 = pid * per, t1 = min(t0 + per, total);
  if (t0 >= t1) return;

  const T* kbase = kc + (size_t)kv_head * stride_kh;
  const T* vbase = vc + (size_t)kv_head * stride_vh;
  // Copies of tile tt's 16 keys of this warp (info, block: fetched before) into stage st;
  // rows past the tile's valid keys are zero-filled without a read.
  auto issue = [&](int st, int info, int blk) {
    uint4* ks = ring + st * 2 * KV;
    uint4* vs = ks + KV;
    const int valid = (info & kKeysMask) - 16 * warp;
#pragma unroll
    for (int i = 0; i < KV / 32; ++i) {
      const int idx = lane + 32 * i, r = idx / ROW, p = idx % ROW;
      const bool in = r < valid;
      const size_t row = (size_t)blk * stride_kb + (size_t)(my_off + r) * stride_kt;
      const size_t vrow = (size_t)blk * stride_vb + (size_t)(my_off + r) * stride_vt;
      const int dst = r * ROW + (p ^ (r & 7));
      octavo::cp_async16(ks + dst, in ? kbase + row + 8 * p : kbase, in);
      octavo::cp_async16(vs + dst, in ? vbase + vrow + 8 * p : vbase, in);
    }
  };
  auto fetch = [&](int tt, int& info, int& blk) {
    if (tt < t1) {
      info = __ldg(tile_info + tt);
      blk = __ldg(tile_blocks + (size_t)tt * bpt + my_blk);
    }
  };

  // The ring's first STAGES - 1 tiles, and the work-list entries of the one after.
  int infos[STAGES];  // tiles t .. t + STAGES - 1's info (the last: fetched, not issued)
  int next_blk = 0;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    int info = 0, blk = 0;
    fetch(t0 + s, info, blk);
    infos[s] = info;
    if (t0 + s < t1) issue(s, info, blk);
    octavo::cp_async_commit();
  }
  infos[STAGES - 1] = 0;
  fetch(t0 + STAGES - 1, infos[STAGES - 1], next_blk);

  uint32_t qa[D / 16][2];  // the request's q rows g (A registers 0 and 2; rows g + 8 zero)
  float acc[ND][4];
  float m_i = kNegBig, l_i = 0.f;  // row g's running max (log2 units) and this lane's sum
#pragma unroll
  for (int n = 0; n < ND; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  auto load_q = [&](int tt) {
    const int tok = __ldg(tile_tok + tt);
    const bool real = g < GROUP;
    const T* qr = q + (size_t)tok * stride_qt + (size_t)(kv_head * GROUP + (real ? g : 0)) *
                                                    stride_qh;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t lo = *reinterpret_cast<const uint32_t*>(qr + 16 * kk + 2 * t);
      const uint32_t hi = *reinterpret_cast<const uint32_t*>(qr + 16 * kk + 8 + 2 * t);
      qa[kk][0] = real ? lo : 0u;
      qa[kk][1] = real ? hi : 0u;
    }
  };
  load_q(t0);

  int rs = t0 - 1;  // the current request's first tile (before t0: begun in another CTA)
  const size_t slot_stride = (size_t)num_kv_heads * GROUP;
  const size_t row0 = ((size_t)pid * 2 * num_kv_heads + kv_head) * GROUP;

  for (int tt = t0; tt < t1; ++tt) {
    const int j = tt - t0;
    octavo::cp_async_wait<STAGES - 2>();  // this thread's copies of tile tt are in
    __syncwarp();  // the warp's are, and it is done with tile tt - 1's stage
    const int info = infos[0];
    if (tt + STAGES - 1 < t1) issue((j + STAGES - 1) % STAGES, infos[STAGES - 1], next_blk);
    octavo::cp_async_commit();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) infos[s] = infos[s + 1];
    fetch(tt + STAGES, infos[STAGES - 1], next_blk);

    const bool first = (info >> kFirstBit) & 1, last = (info >> kLastBit) & 1;
    if (first) {
      rs = tt;
      m_i = kNegBig;
      l_i = 0.f;
#pragma unroll
      for (int n = 0; n < ND; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
      if (tt != t0) load_q(tt);
    }
    const int valid = (info & kKeysMask) - 16 * warp;
    if (valid > 0) {
      const uint4* ks = ring + (j % STAGES) * 2 * KV;
      const uint4* vs = ks + KV;
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      const int mi = lane >> 3, mr = lane & 7;  // the lane's ldmatrix matrix and row
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        // Matrices (keys 0-7, dims 16kk..+7), (0-7, +8..+15), (8-15, ..), (8-15, ..).
        const int key = 8 * (mi >> 1) + mr, piece = 2 * kk + (mi & 1);
        uint32_t b[4];
        ldmatrix_x4(b, ks + key * ROW + (piece ^ (key & 7)));
        M::mma(s[0], qa[kk][0], 0u, qa[kk][1], 0u, b[0], b[1]);
        M::mma(s[1], qa[kk][0], 0u, qa[kk][1], 0u, b[2], b[3]);
      }
      // Row g's keys 8 n + 2t + {0, 1}: s[n][0], s[n][1] (s[n][2..3]: the zero rows g + 8).
      float mx = m_i;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = 8 * n + 2 * t + c;
          s[n][c] = key < valid ? s[n][c] * qk_scale : OCTAVO_NEG_INF;
          mx = fmaxf(mx, s[n][c]);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float alpha = exp2f(m_i - mx);
      m_i = mx;
      float p[2][2];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) p[n][c] = exp2f(s[n][c] - mx);
      l_i = l_i * alpha + (p[0][0] + p[0][1] + p[1][0] + p[1][1]);
#pragma unroll
      for (int n = 0; n < ND; ++n) {
        acc[n][0] *= alpha;
        acc[n][1] *= alpha;
      }
      const uint32_t pa0 = pack2<T>(p[0][0], p[0][1]), pa2 = pack2<T>(p[1][0], p[1][1]);
#pragma unroll
      for (int n = 0; n < ND; n += 2) {
        // Matrices (keys 0-7, dims 8n..), (8-15, 8n..), (0-7, 8(n+1)..), (8-15, 8(n+1)..).
        const int key = 8 * (mi & 1) + mr, piece = n + (mi >> 1);
        uint32_t b[4];
        ldmatrix_x4_trans(b, vs + key * ROW + (piece ^ (key & 7)));
        M::mma(acc[n], pa0, 0u, pa2, 0u, b[0], b[1]);
        M::mma(acc[n + 1], pa0, 0u, pa2, 0u, b[2], b[3]);
      }
    }

    if (last || tt == t1 - 1) {
      // The warps' states meet: each stores row g's (m, l, acc), the CTA combines them.
      float l_sum = l_i;
      l_sum += __shfl_xor_sync(0xffffffffu, l_sum, 1);
      l_sum += __shfl_xor_sync(0xffffffffu, l_sum, 2);
      if (g < GROUP) {
        float* a = macc + (warp * GROUP + g) * D;
#pragma unroll
        for (int n = 0; n < ND; ++n)
          *reinterpret_cast<float2*>(a + 8 * n + 2 * t) = make_float2(acc[n][0], acc[n][1]);
        if (t == 0) {
          mml[(warp * GROUP + g) * 2] = m_i;
          mml[(warp * GROUP + g) * 2 + 1] = l_sum;
        }
      }
      __syncthreads();
      const bool whole = last && rs >= t0;
      const int tok = __ldg(tile_tok + tt);
      const size_t prow = row0 + (rs <= t0 ? 0 : slot_stride);
      for (int e = threadIdx.x; e < GROUP * D; e += 32 * WARPS) {
        const int r = e / D, d = e % D;
        float mx = kNegBig;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, mml[(w * GROUP + r) * 2]);
        float l = 0.f, o = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
          const float f = exp2f(mml[(w * GROUP + r) * 2] - mx);
          l += mml[(w * GROUP + r) * 2 + 1] * f;
          o += macc[(w * GROUP + r) * D + d] * f;
        }
        if (whole) {
          out[(size_t)tok * stride_ot + (size_t)(kv_head * GROUP + r) * stride_oh + d] =
              M::from_float(o / l);
        } else {
          part_acc[(prow + r) * D + d] = o;
          if (d == 0) {
            part_ml[(prow + r) * 2] = mx;
            part_ml[(prow + r) * 2 + 1] = l;
          }
        }
      }
      __syncthreads();  // the merge area is free again
    }
  }
  octavo::cp_async_wait<0>();

  // The cut requests: the one tile t0 lies in unless whole here, the one tile t1 - 1 lies
  // in if another and it goes on past t1. The last of a request's pieces merges them.
  auto merge = [&](int i, int start, int end) {
    __threadfence();  // this CTA's partial stores, before the ticket
    __syncthreads();
    if (threadIdx.x == 0) {
      const int b = __ldg(order + i);
      int tk;
      asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;"
                   : "=r"(tk) : "l"(cnt + b * num_kv_heads + kv_head) : "memory");
      ticket_s = tk == (end - 1) / per - start / per;
    }
    __syncthreads();
    if (!ticket_s) return;
    __threadfence();
    const int b = __ldg(order + i);
    const int tok = __ldg(qsl + b);
    const int p_first = start / per, p_last = (end - 1) / per;
    for (int e = threadIdx.x; e < GROUP * D; e += 32 * WARPS) {
      const int r = e / D, d = e % D;
      float mx = kNegBig, l = 0.f, o = 0.f;
      for (int pp = p_first; pp <= p_last; ++pp) {
        const int slot = pp * per >= start ? 0 : 1;
        const size_t row = (((size_t)pp * 2 + slot) * num_kv_heads + kv_head) * GROUP + r;
        const float mp = __ldcg(part_ml + row * 2), lp = __ldcg(part_ml + row * 2 + 1);
        const float ap = __ldcg(part_acc + row * D + d);
        const float mn = fmaxf(mx, mp);
        const float fa = exp2f(mx - mn), fb = exp2f(mp - mn);
        l = l * fa + lp * fb;
        o = o * fa + ap * fb;
        mx = mn;
      }
      out[(size_t)tok * stride_ot + (size_t)(kv_head * GROUP + r) * stride_oh + d] =
          M::from_float(o / l);
    }
    __syncthreads();
    if (threadIdx.x == 0) atomicExch(cnt + b * num_kv_heads + kv_head, 0);
  };
  const int j0 = __ldg(tile_req + t0);
  const int start0 = __ldg(cu + j0), end0 = __ldg(cu + j0 + 1);
  if (start0 < t0 || end0 > t1) merge(j0, start0, end0);
  const int j1 = __ldg(tile_req + t1 - 1);
  const int start1 = __ldg(cu + j1), end1 = __ldg(cu + j1 + 1);
  if (j1 != j0 && end1 > t1) merge(j1, start1, end1);
}

}  // namespace

// streamk_attention_{dtype}_d{D}_g{GROUP}_w{WARPS}_p{STAGES}: grid (P, KV heads), 32 WARPS
// threads, shared_bytes<D, GROUP, WARPS, STAGES>() of dynamic shared memory.
#define OCTAVO_STREAMK_ATTENTION(TN, T, D, GROUP, WARPS, STAGES)                               \
  extern "C" __global__ void __launch_bounds__(32 * WARPS)                                     \
      streamk_attention_##TN##_d##D##_g##GROUP##_w##WARPS##_p##STAGES(                         \
          T* out, const T* q, const T* kc, const T* vc, const int* cu, const int* order,       \
          const int* tile_tok, const int* tile_info, const int* tile_req,                      \
          const int* tile_blocks, float* part_acc, float* part_ml, int* cnt, const int* qsl,   \
          float qk_scale, int num_seqs, int num_progs, int stride_qt, int stride_qh,           \
          int stride_ot, int stride_oh, int stride_kb, int stride_kt, int stride_kh,           \
          int stride_vb, int stride_vt, int stride_vh, int block_size) {                       \
    streamk_attention<T, D, GROUP, WARPS, STAGES>(                                             \
        out, q, kc, vc, cu, order, tile_tok, tile_info, tile_req, tile_blocks, part_acc,       \
        part_ml, cnt, qsl, qk_scale, num_seqs, num_progs, stride_qt, stride_qh, stride_ot,     \
        stride_oh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,           \
        block_size);                                                                           \
  }

#define OCTAVO_STREAMK_ATTENTION_PLANS(TN, T, GROUP) \
  OCTAVO_STREAMK_ATTENTION(TN, T, 128, GROUP, 4, 2)  \
  OCTAVO_STREAMK_ATTENTION(TN, T, 128, GROUP, 4, 3)  \
  OCTAVO_STREAMK_ATTENTION(TN, T, 128, GROUP, 8, 2)

#define OCTAVO_STREAMK_ATTENTION_ALL(TN, T)  \
  OCTAVO_STREAMK_ATTENTION_PLANS(TN, T, 1)   \
  OCTAVO_STREAMK_ATTENTION_PLANS(TN, T, 2)   \
  OCTAVO_STREAMK_ATTENTION_PLANS(TN, T, 4)   \
  OCTAVO_STREAMK_ATTENTION_PLANS(TN, T, 8)

OCTAVO_STREAMK_ATTENTION_ALL(bf16, __nv_bfloat16)
OCTAVO_STREAMK_ATTENTION_ALL(f16, __half)
