// Weight-only 4- and 8-bit GEMM for decode batches (M <= 16) over the swap-AB layout of
// octavo/kernels/w4a16_swapab.py, on the tensor cores' mma.sync with the weights as the A
// operand: out^T [N, M] = dequant(W)^T [N, K] @ x^T [K, M]. octavo/kernels/swapab_mma.py
// builds it (nvcc, at first use), plans the launch and says why it is shaped this way.
//
// Layout (4-bit): int16 [N / 4, K], K contiguous; nibble c of int16 row R is output column
// n = (R / 64) * 256 + c * 64 + R % 64 (8-bit: byte c, see column() below). A warp takes 16 int16
// rows (64 output columns) over a range of K, in steps of 32: lane (g = lane / 4, t = lane % 4) loads 16 bytes of rows g and
// g + 8 at k + 8t, i.e. K values 8t..8t+7 of the step. The sum over K does not care which K
// value the mma calls which, so the two m16n8k16 products of a step take physical K
// 8t + 4h + {0, 1, 2, 3} (h = 0, 1) as their logical columns {2t, 2t+1, 2t+8, 2t+9}, and the
// activations (B operand, one batch row per g) are loaded the same way: every register the
// loads fill is an operand register as it stands, no shuffles, no shared memory.

#include "mma_common.cuh"

namespace {

using octavo::pdl_wait;
using octavo::word;

// The 16-bit operand type's constants and operations (bf16 or fp16).
template <typename T>
struct Type : octavo::MmaType<T> {
  static constexpr bool kBf16 = octavo::MmaType<T>::kBf16;
  // (q | magic) is exactly bias + q: bf16 128 + q (q < 128), fp16 1024 + q. The bias goes
  // into the zero point.
  static constexpr uint32_t kMagic = kBf16 ? 0x43004300u : 0x64006400u;
  static constexpr float kBias = kBf16 ? 128.0f : 1024.0f;
  static constexpr uint32_t kOnes = kBf16 ? 0x3F803F80u : 0x3C003C00u;  // two 1.0
};

// 8-bit values as one 16-bit float each (below): fp16 1024 + q; bf16 q - 128 (its 8
// significant bits hold every integer of [-256, 256] but no 256 consecutive ones of one
// binade, so no bit construction alone gives a linear map of q: one float op is needed).
template <typename T>
struct Byte {
  static constexpr float kBias = Type<T>::kBf16 ? -128.0f : 1024.0f;
};

// Nibble c of both int16 halves of v as two 16-bit floats bias + q: one shift, one LOP3.
template <typename T, int C>
__device__ __forceinline__ uint32_t nibbles(uint32_t v) {
  uint32_t r;
  if (C) v >>= 4 * C;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(v), "n"(0x000F000F), "n"(Type<T>::kMagic));
  return r;
}

// Byte C of both int16 halves of v (bytes C and C + 2) as two 16-bit floats bias + q, exact.
// fp16: one PRMT puts 0x64 above each byte, 0x64qq = 1024 + q (10 mantissa bits). bf16: with
// lo = 0x4300 | (q & 127) = 128 + (q & 127) (one LOP3) and y = 0x4380 ^ (q & 128), i.e. 256
// for q < 128 and 128 for q >= 128 (one LOP3), lo - y = q - 128 in both cases (one HFMA2,
// exact: both operands and the result are integers of at most 8 significant bits); byte 1
// is shifted down first. Per 32-bit word (4 weights): 2 instructions (fp16) or 7 (bf16),
// where the two nibbles of each byte took 7 and two mma products.
template <typename T, int C>
__device__ __forceinline__ uint32_t bytes(uint32_t v) {
  uint32_t r;
  if constexpr (!Type<T>::kBf16) {
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x64646464u), "n"(C ? 0x4341 : 0x4240));
  } else {
    if (C) v >>= 8;
    uint32_t lo, y;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(lo) : "r"(v), "n"(0x007F007F), "n"(0x43004300));
    asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(y) : "r"(v), "n"(0x00800080), "n"(0x43804380));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(y), "r"(0xBF80BF80u), "r"(lo));  // lo - y
  }
  return r;
}

// A scale or zero point as stored (bf16 or fp16 bits, whichever the checkpoint has: GPTQ
// keeps float16 scales under a bf16 model) as a float. The dtype is compiled in: a runtime
// flag raised the 1-8 row kernel from 194 to 227 registers.
template <typename S>
__device__ __forceinline__ float scale_float(unsigned short v) {
  if constexpr (Type<S>::kBf16)
    return __uint_as_float((uint32_t)v << 16);
  else
    return __half2float(__ushort_as_half(v));
}

// 8-bit weights: int16 row R holds two values v (bits 8v..8v+7) of output columns
// n = (R / 64) * 128 + v * 64 + R % 64, value v being the 4-bit path's block v (bytes()).
template <int BITS>
__device__ __forceinline__ int column(int row) {  // of value 0; value v is 64 v further
  return BITS == 4 ? (row >> 6) * 256 + (row & 63) : (row >> 6) * 128 + (row & 63);
}

template <typename T, typename S, int BITS, int MT, int STEPS, int STAGES, bool GLU>
__device__ __forceinline__ void swapab_mma(
    const T* __restrict__ x, const uint4* __restrict__ w, const unsigned short* __restrict__ s,
    const unsigned short* __restrict__ z, T* __restrict__ out, float* __restrict__ part,
    int* __restrict__ cnt, int M, int M_all, int N, int K, int stride_x, int k_per_warp,
    int group, int tile) {
  // M: this CTA's rows (at most 16); M_all: the output's (the split partials' row count);
  // tile: its 16 int16 rows of the layout.
  constexpr int CHUNK = 32 * STEPS;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int k_begin = (blockIdx.y * warps + warp) * k_per_warp;
  const int k_end = min(k_begin + k_per_warp, K);
  const int row = tile * 16 + g;  // this lane's int16 rows: row and row + 8
  // Step k of int16 row R at R * K + k: the lane's 16 bytes of a step, 4 uint4 per step.
  const uint4* wa = w + ((size_t)row * K + 8 * t) / 8;
  const uint4* wb = w + ((size_t)(row + 8) * K + 8 * t) / 8;
  constexpr int VALUES = 16 / BITS;  // output columns per int16: 4 or 2
  // Output columns of the lane's rows, per value v: n0 + 64 v and n1 + 64 v.
  const int n0 = column<BITS>(row);
  const int n1 = column<BITS>(row + 8);

  float acc[MT][VALUES][4];
  float tmp[MT][VALUES][4];
  float xs[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      xs[mt][i] = 0.f;
#pragma unroll
      for (int c = 0; c < VALUES; ++c) acc[mt][c][i] = tmp[mt][c][i] = 0.f;
    }
  }

  // One chunk's operands (weights, activations, scales, zeros), then its arithmetic.
  uint4 ca[STEPS], cb[STEPS], xv[MT][STEPS];
  unsigned short sv[VALUES][2], zv[VALUES][2];
  auto chunk = [&](int k) {
#pragma unroll
    for (int i = 0; i < STEPS; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t ra0 = word(ca[i], 2 * h), ra1 = word(ca[i], 2 * h + 1);
        const uint32_t rb0 = word(cb[i], 2 * h), rb1 = word(cb[i], 2 * h + 1);
        uint32_t a[VALUES][4];
        if constexpr (BITS == 4) {
          a[0][0] = nibbles<T, 0>(ra0); a[0][1] = nibbles<T, 0>(rb0);
          a[0][2] = nibbles<T, 0>(ra1); a[0][3] = nibbles<T, 0>(rb1);
          a[1][0] = nibbles<T, 1>(ra0); a[1][1] = nibbles<T, 1>(rb0);
          a[1][2] = nibbles<T, 1>(ra1); a[1][3] = nibbles<T, 1>(rb1);
          a[2][0] = nibbles<T, 2>(ra0); a[2][1] = nibbles<T, 2>(rb0);
          a[2][2] = nibbles<T, 2>(ra1); a[2][3] = nibbles<T, 2>(rb1);
          a[3][0] = nibbles<T, 3>(ra0); a[3][1] = nibbles<T, 3>(rb0);
          a[3][2] = nibbles<T, 3>(ra1); a[3][3] = nibbles<T, 3>(rb1);
        } else {
          a[0][0] = bytes<T, 0>(ra0); a[0][1] = bytes<T, 0>(rb0);
          a[0][2] = bytes<T, 0>(ra1); a[0][3] = bytes<T, 0>(rb1);
          a[1][0] = bytes<T, 1>(ra0); a[1][1] = bytes<T, 1>(rb0);
          a[1][2] = bytes<T, 1>(ra1); a[1][3] = bytes<T, 1>(rb1);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t b0 = word(xv[mt][i], 2 * h), b1 = word(xv[mt][i], 2 * h + 1);
#pragma unroll
          for (int c = 0; c < VALUES; ++c)
            Type<T>::mma(tmp[mt][c], a[c][0], a[c][1], a[c][2], a[c][3], b0, b1);
          // The column sums of x over the same K (every row of a ones A operand).
          Type<T>::mma(xs[mt], Type<T>::kOnes, Type<T>::kOnes, Type<T>::kOnes,
                       Type<T>::kOnes, b0, b1);
        }
      }
    }
    if ((k + CHUNK) % group == 0 || k + CHUNK >= k_end) {
      // sum_k x (bias + q - (bias + z)) s = s (tmp - (z + bias) xs), once per group.
      constexpr float BIAS = BITS == 4 ? Type<T>::kBias : Byte<T>::kBias;
#pragma unroll
      for (int c = 0; c < VALUES; ++c) {
        const float s0 = scale_float<S>(sv[c][0]);
        const float s1 = scale_float<S>(sv[c][1]);
        const float z0 = scale_float<S>(zv[c][0]) + BIAS;
        const float z1 = scale_float<S>(zv[c][1]) + BIAS;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float d[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) d[i] = tmp[mt][c][i];
          acc[mt][c][0] = fmaf(s0, fmaf(-z0, xs[mt][0], d[0]), acc[mt][c][0]);
          acc[mt][c][1] = fmaf(s0, fmaf(-z0, xs[mt][1], d[1]), acc[mt][c][1]);
          acc[mt][c][2] = fmaf(s1, fmaf(-z1, xs[mt][2], d[2]), acc[mt][c][2]);
          acc[mt][c][3] = fmaf(s1, fmaf(-z1, xs[mt][3], d[3]), acc[mt][c][3]);
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int c = 0; c < VALUES; ++c)
#pragma unroll
          for (int i = 0; i < 4; ++i) tmp[mt][c][i] = 0.f;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) xs[mt][i] = 0.f;
    }
  };

  if constexpr (STAGES == 0) {
    // Software pipeline, one chunk deep in registers: the next chunk's weights, activations,
    // scales and zeros are loaded before this chunk's arithmetic.
    uint4 na[STEPS], nb[STEPS];
    uint4 nx[MT][STEPS];
    unsigned short ns[VALUES][2], nz[VALUES][2];
    auto load_weights = [&](int k) {
#pragma unroll
      for (int i = 0; i < STEPS; ++i) {
        na[i] = __ldg(wa + (k / 32 + i) * 4);
        nb[i] = __ldg(wb + (k / 32 + i) * 4);
      }
      const size_t base = (size_t)(k / group) * N;
#pragma unroll
      for (int c = 0; c < VALUES; ++c) {
        ns[c][0] = __ldg(s + base + n0 + 64 * c);
        ns[c][1] = __ldg(s + base + n1 + 64 * c);
        nz[c][0] = __ldg(z + base + n0 + 64 * c);
        nz[c][1] = __ldg(z + base + n1 + 64 * c);
      }
    };
    auto load_x = [&](int k) { octavo::load_x(nx, x, M, stride_x, k, g, t); };
    if (k_begin < k_end) load_weights(k_begin);
    pdl_wait();  // the first weights are on their way while the previous kernel ends
    if (k_begin < k_end) load_x(k_begin);
    for (int k = k_begin; k < k_end; k += CHUNK) {
#pragma unroll
      for (int i = 0; i < STEPS; ++i) {
        ca[i] = na[i];
        cb[i] = nb[i];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) xv[mt][i] = nx[mt][i];
      }
#pragma unroll
      for (int c = 0; c < VALUES; ++c) {
        sv[c][0] = ns[c][0]; sv[c][1] = ns[c][1];
        zv[c][0] = nz[c][0]; zv[c][1] = nz[c][1];
      }
      if (k + CHUNK < k_end) {
        load_weights(k + CHUNK);
        load_x(k + CHUNK);
      }
      chunk(k);
    }
  } else {
    // STAGES chunks in flight through shared memory (cp.async): each warp a ring of its own,
    // each lane copying and reading back its own weights and activations; the tile's scales
    // and zeros (VALUES segments of 16 columns each, col0 + 64 c + [0, 16): lane g's columns
    // n0 = col0 + g and n1 = n0 + 8) are copied by 4 VALUES lanes and read by all, so the
    // warp syncs before reading a stage and before overwriting one.
    constexpr int X_OFF = STEPS * 64;  // uint4: weights [STEPS][2][32]
    constexpr int SZ_OFF = X_OFF + MT * STEPS * 32;  // activations [MT][STEPS][32]
    constexpr int STAGE = SZ_OFF + 4 * VALUES;  // scales, zeros [2][VALUES][2] (16 columns each)
    extern __shared__ uint4 ring_base[];
    uint4* ring = ring_base + warp * STAGES * STAGE;
    const int col0 = column<BITS>(tile * 16);
    const int chunks = k_begin < k_end ? (k_end - k_begin + CHUNK - 1) / CHUNK : 0;
    auto issue_weights = [&](uint4* st, int k) {
#pragma unroll
      for (int i = 0; i < STEPS; ++i) {
        octavo::cp_async16(st + (2 * i) * 32 + lane, wa + (k / 32 + i) * 4);
        octavo::cp_async16(st + (2 * i + 1) * 32 + lane, wb + (k / 32 + i) * 4);
      }
      if (lane < 4 * VALUES) {
        const unsigned short* src = (lane < 2 * VALUES ? s : z) + (size_t)(k / group) * N +
                                    col0 + 64 * ((lane >> 1) % VALUES) + 8 * (lane & 1);
        octavo::cp_async16(st + SZ_OFF + lane, src);
      }
    };
    auto issue_x = [&](uint4* st, int k) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int m = mt * 8 + g;
#pragma unroll
        for (int i = 0; i < STEPS; ++i)
          octavo::cp_async16(st + X_OFF + (mt * STEPS + i) * 32 + lane,
                             m < M ? x + (size_t)m * stride_x + k + 32 * i + 8 * t : x, m < M);
      }
    };
    auto stage = [&](int j) { return ring + (j % STAGES) * STAGE; };
#pragma unroll
    for (int j = 0; j < STAGES - 1; ++j)
      if (j < chunks) issue_weights(stage(j), k_begin + j * CHUNK);
    pdl_wait();  // the first weights are on their way while the previous kernel ends
#pragma unroll
    for (int j = 0; j < STAGES - 1; ++j) {
      if (j < chunks) issue_x(stage(j), k_begin + j * CHUNK);
      octavo::cp_async_commit();
    }
    for (int j = 0; j < chunks; ++j) {
      const int k = k_begin + j * CHUNK;
      __syncwarp();  // every lane is done with the stage the next copy overwrites
      if (j + STAGES - 1 < chunks) {
        uint4* st = stage(j + STAGES - 1);
        issue_weights(st, k + (STAGES - 1) * CHUNK);
        issue_x(st, k + (STAGES - 1) * CHUNK);
      }
      octavo::cp_async_commit();
      octavo::cp_async_wait<STAGES - 1>();  // chunk j's group is in
      __syncwarp();
      const uint4* st = stage(j);
#pragma unroll
      for (int i = 0; i < STEPS; ++i) {
        ca[i] = st[(2 * i) * 32 + lane];
        cb[i] = st[(2 * i + 1) * 32 + lane];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) xv[mt][i] = st[X_OFF + (mt * STEPS + i) * 32 + lane];
      }
      const unsigned short* sz = reinterpret_cast<const unsigned short*>(st + SZ_OFF);
#pragma unroll
      for (int c = 0; c < VALUES; ++c) {
        sv[c][0] = sz[16 * c + g]; sv[c][1] = sz[16 * c + g + 8];
        zv[c][0] = sz[16 * (VALUES + c) + g]; zv[c][1] = sz[16 * (VALUES + c) + g + 8];
      }
      chunk(k);
    }
    octavo::cp_async_wait<0>();
  }

  // The CTA's warps hold K ranges of the same tile: add them up in warp 0 (pipelined: in the
  // rings, once every warp is done with its own).
  if constexpr (STAGES == 0) {
    if (!octavo::cta_sum<VALUES>(acc, warp, warps, lane)) return;
  } else {
    extern __shared__ uint4 ring_base[];
    if (warps > 1) __syncthreads();
    if (!octavo::cta_sum_at<VALUES>(reinterpret_cast<float*>(ring_base), acc, warp, warps, lane))
      return;
  }

  // fn(accumulator, offset in [M, N]) for each of the lane's outputs in the batch.
  auto each_output = [&](auto fn) {
    octavo::each_row<MT>(t, M, [&](int mt, int i, int m) {
      const int nb0 = (i < 2 ? n0 : n1);
#pragma unroll
      for (int c = 0; c < VALUES; ++c) fn(acc[mt][c][i], (size_t)m * N + nb0 + 64 * c);
    });
  };
  // GLU: the weight's columns are [gate | up] in blocks of 32 VALUES (value c < VALUES / 2
  // gate, c + VALUES / 2 the same column of up: the loader's ``glu_blocked`` order), and the
  // lane writes silu(gate) * up from its float accumulators into an [M, N / 2] output in the
  // MLP's own column order, gate and up each rounded to T first: the bits of the GEMM's
  // output through activation.py's kernel. (Without GLU the code below is the plain store's
  // as it was measured, instruction for instruction.)
  auto store_glu = [&]() {
    constexpr int HALF = VALUES / 2;
    const int half_n = N / 2;
    octavo::each_row<MT>(t, M, [&](int mt, int i, int m) {
      const int nb = (i < 2 ? n0 : n1);
      const int col = (nb / (64 * VALUES)) * (32 * VALUES) + nb % (64 * VALUES);
#pragma unroll
      for (int c = 0; c < HALF; ++c)
        out[(size_t)m * half_n + col + 64 * c] =
            Type<T>::from_float(octavo::silu_mul(Type<T>::round(acc[mt][c][i]),
                                                 Type<T>::round(acc[mt][c + HALF][i])));
    });
  };
  const int splits = gridDim.y;
  if constexpr (GLU) {
    if (splits == 1) {
      store_glu();
      return;
    }
    each_output([&](float a, size_t o) { part[(size_t)blockIdx.y * M_all * N + o] = a; });
  } else {
    each_output([&](float a, size_t o) {
      if (splits == 1)
        out[o] = Type<T>::from_float(a);
      else
        part[(size_t)blockIdx.y * M_all * N + o] = a;
    });
    if (splits == 1) return;
  }
  // Split over CTAs: the CTA that takes the tile's last ticket adds the partials in split
  // order (deterministic), writes the output and leaves the counter zeroed for the next call.
  if (!octavo::last_ticket(cnt + tile, splits, lane)) return;
  // The accumulators become the sums of the partials in split order (deterministic), read
  // from L2 where the other SMs wrote them (.cg: not a stale L1 line): each split's partials
  // of all the lane's outputs at once, one L2 round trip a split; an output at a time cost
  // one round trip an output (32 of them at 16 rows, in the one warp that adds them).
  each_output([&](float& a, size_t) { a = 0.f; });
  for (int sp = 0; sp < splits; ++sp) {
    const float* ps = part + (size_t)sp * M_all * N;
    each_output([&](float& a, size_t o) { a += __ldcg(ps + o); });
  }
  if constexpr (GLU)
    store_glu();
  else
    each_output([&](float& a, size_t o) { out[o] = Type<T>::from_float(a); });
  octavo::release_tile(cnt + tile, lane);
}

}  // namespace

// Grid (tiles x row chunks, K splits): CTA x takes tile x / chunks and chunk x % chunks, rows
// 16 c .. 16 c + 15 of a batch of up to 16 chunks rows (one chunk: the whole batch, M <= 16),
// its outputs, partials and tickets its own. A tile's chunks are neighbours in launch order,
// so they run together and all but one read its weights from L2 (a layer larger than the L2
// too: chunks on the grid's slowest axis re-read it from HBM).
#define OCTAVO_SWAPAB_MMA(NAME, T, S, BITS, MT, STEPS, STAGES, GLU)                        \
  extern "C" __global__ void __launch_bounds__(256) NAME(                                     \
      const T* x, const uint4* w, const unsigned short* s, const unsigned short* z, T* out,   \
      float* part, int* cnt, int M, int N, int K, int stride_x, int k_per_warp, int group) {  \
    const int chunks = (M + 15) / 16;                                                         \
    const int chunk = blockIdx.x % chunks;                                                    \
    const int m0 = chunk * 16;                                                                \
    swapab_mma<T, S, BITS, MT, STEPS, STAGES, GLU>(                                           \
        x + (size_t)m0 * stride_x, w, s, z, out + (size_t)m0 * (GLU ? N / 2 : N),            \
        part + (size_t)m0 * N,                                                                \
        cnt + chunk * (gridDim.x / chunks), min(M - m0, 16), M, N, K, stride_x, k_per_warp,  \
        group, blockIdx.x / chunks);                                                          \
  }

// swapab_mma_{activations}_{scales}_w{bits}_m{8,16}_s{steps}[_p{stages}]: without _p the
// registers' one-chunk pipeline, with it STAGES chunks in flight through shared memory.
#define OCTAVO_SWAPAB_MMA_ALL(TN, T, SN, S, BITS)                                        \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w##BITS##_m8_s1, T, S, BITS, 1, 1, 0, false)       \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w##BITS##_m8_s2, T, S, BITS, 1, 2, 0, false)       \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w##BITS##_m8_s4, T, S, BITS, 1, 4, 0, false)       \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w##BITS##_m16_s1, T, S, BITS, 2, 1, 0, false)      \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w##BITS##_m16_s2, T, S, BITS, 2, 2, 0, false)      \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w##BITS##_m16_s4, T, S, BITS, 2, 4, 0, false)      \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w##BITS##_m8_s4_p3, T, S, BITS, 1, 4, 3, false)    \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w##BITS##_m8_s4_p4, T, S, BITS, 1, 4, 4, false)    \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w##BITS##_m16_s4_p3, T, S, BITS, 2, 4, 3, false)   \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w##BITS##_m16_s4_p4, T, S, BITS, 2, 4, 4, false)

#define OCTAVO_SWAPAB_MMA_SCALES(TN, T, BITS)                  \
  OCTAVO_SWAPAB_MMA_ALL(TN, T, bf16, __nv_bfloat16, BITS)      \
  OCTAVO_SWAPAB_MMA_ALL(TN, T, f16, __half, BITS)

// _glu: the MLP's [gate | up] weight in glu_blocked order, silu(gate) * up written (4- and
// 8-bit, groups of 128 and their multiples, the registers' pipeline: Llama-8B's gate_up at
// 1-16 rows).
#define OCTAVO_SWAPAB_MMA_GLU(TN, T, SN, S)                                               \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w4_m8_s4_glu, T, S, 4, 1, 4, 0, true)        \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w4_m16_s4_glu, T, S, 4, 2, 4, 0, true)       \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w8_m8_s4_glu, T, S, 8, 1, 4, 0, true)        \
  OCTAVO_SWAPAB_MMA(swapab_mma_##TN##_##SN##_w8_m16_s4_glu, T, S, 8, 2, 4, 0, true)

OCTAVO_SWAPAB_MMA_GLU(bf16, __nv_bfloat16, bf16, __nv_bfloat16)
OCTAVO_SWAPAB_MMA_GLU(bf16, __nv_bfloat16, f16, __half)
OCTAVO_SWAPAB_MMA_GLU(f16, __half, bf16, __nv_bfloat16)
OCTAVO_SWAPAB_MMA_GLU(f16, __half, f16, __half)

OCTAVO_SWAPAB_MMA_SCALES(bf16, __nv_bfloat16, 4)
OCTAVO_SWAPAB_MMA_SCALES(bf16, __nv_bfloat16, 8)
OCTAVO_SWAPAB_MMA_SCALES(f16, __half, 4)
OCTAVO_SWAPAB_MMA_SCALES(f16, __half, 8)
