// Greedy sampling's argmax over each row of float32 logits, as torch.argmax(dim=-1): the first
// index of the row's maximum, or of its first NaN where it has one. torch's CPU argmax walks
// the row with a scalar (value, index) pair: 1.3 ms for 32 x 49152 logits on one core of the
// 2-core EPYC, ~2% of a W6 decode step; a vector max, then a vector search for the first
// index holding it, reads the row twice at memory speed (~0.1 ms).
#include <limits>

#include "common.h"
#include "ops.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace octavo_cpu {
namespace {

int64_t argmax_row(const float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  bool nan = false;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 vmx = _mm512_set1_ps(mx);
  __mmask16 unordered = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    vmx = _mm512_max_ps(vmx, v);
  }
  nan = unordered != 0;
  mx = _mm512_reduce_max_ps(vmx);
#endif
  for (; i < n; ++i) {
    nan = nan || std::isnan(x[i]);
    mx = x[i] > mx ? x[i] : mx;
  }
  if (nan) {  // torch ranks NaN above every number
    for (int64_t j = 0; j < n; ++j) {
      if (std::isnan(x[j])) return j;
    }
  }
  i = 0;
#if defined(__AVX512F__)
  const __m512 target = _mm512_set1_ps(mx);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), target, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
#endif
  for (; i < n; ++i) {
    if (x[i] == mx) return i;
  }
  return 0;  // unreachable: some element equals the row's maximum
}

}  // namespace

at::Tensor argmax_rows(const at::Tensor& logits) {
  check_cpu(logits, "logits");
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat &&
                  logits.stride(1) == 1 && logits.size(1) > 0,
              "argmax_rows: logits must be float32 [rows, n > 0] with a contiguous last dim");
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  at::Tensor out = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* xp = logits.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) op[r] = argmax_row(xp + r * stride, n);
  });
  return out;
}

}  // namespace octavo_cpu
