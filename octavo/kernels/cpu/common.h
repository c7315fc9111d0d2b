// Shared helpers for Octavo's CPU kernels: element conversion, a fast vectorisable exp, and
// the dtype switch. Loops are written so that g++ -O3 -march=native vectorises them.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace octavo_cpu {

using bf16 = c10::BFloat16;

inline float to_f(float x) { return x; }

inline float to_f(bf16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

template <typename T>
inline T from_f(float x);

template <>
inline float from_f<float>(float x) {
  return x;
}

template <>
inline bf16 from_f<bf16>(float x) {
  return bf16(x);  // round to nearest even, as torch does
}

// exp(x) for x <= ~88: range reduction by ln 2 and a degree-6 polynomial on [-ln2/2, ln2/2]
// (Cephes coefficients), about 1-2 ulp. Branch-free, so loops over it vectorise.
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float n = (x * 1.44269504088896341f + magic) - magic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}

// Runs body<scalar_t>() for float32 and bfloat16; other dtypes raise.
#define OCTAVO_DISPATCH(DTYPE, NAME, ...)                                        \
  [&] {                                                                          \
    switch (DTYPE) {                                                             \
      case at::kFloat: {                                                         \
        using scalar_t = float;                                                  \
        return __VA_ARGS__();                                                    \
      }                                                                          \
      case at::kBFloat16: {                                                      \
        using scalar_t = octavo_cpu::bf16;                                       \
        return __VA_ARGS__();                                                    \
      }                                                                          \
      default:                                                                   \
        TORCH_CHECK(false, NAME, ": unsupported dtype ", DTYPE,                  \
                    " (float32 and bfloat16 only)");                             \
    }                                                                            \
  }()

inline void check_cpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor");
}

// Rows of at least this many elements between forks of the thread pool.
constexpr int64_t kGrainElems = 16384;

inline int64_t row_grain(int64_t row_elems) {
  return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, row_elems));
}

}  // namespace octavo_cpu
