// RMSNorm and fused residual-add + RMSNorm over the last dimension.
//
// Numerics as octavo/layers/norm.py: the residual sum is rounded to the input dtype, the mean
// of squares and the scaling run in fp32, the normalised value is rounded to the input dtype
// and then multiplied by the weight (in fp32, rounded once more).
#include "common.h"
#include "ops.h"

namespace octavo_cpu {
namespace {

template <typename T>
float inv_rms(const T* x, int64_t n, float eps) {
  constexpr int W = 16;
  float acc[W] = {0.0f};
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    for (int l = 0; l < W; ++l) {
      float v = to_f(x[i + l]);
      acc[l] += v * v;
    }
  }
  float sum = 0.0f;
  for (; i < n; ++i) {
    float v = to_f(x[i]);
    sum += v * v;
  }
  for (int l = 0; l < W; ++l) sum += acc[l];
  return 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
}

template <typename T>
void scale_row(T* out, const T* x, const T* w, int64_t n, float r) {
  for (int64_t i = 0; i < n; ++i) {
    float normed = to_f(from_f<T>(to_f(x[i]) * r));
    out[i] = from_f<T>(to_f(w[i]) * normed);
  }
}

// Offset of row `row` of a tensor whose last dimension is contiguous.
inline int64_t row_offset(const at::Tensor& t, int64_t row) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    int64_t size = t.size(d);
    off += (row % size) * t.stride(d);
    row /= size;
  }
  return off;
}

void check_norm(const at::Tensor& x, const at::Tensor& weight) {
  check_cpu(x, "x");
  check_cpu(weight, "weight");
  TORCH_CHECK(x.dim() >= 1 && x.stride(-1) == 1, "rms_norm: x needs a contiguous last dim");
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == x.size(-1),
              "rms_norm: weight must be contiguous [hidden]");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "rms_norm: weight dtype != x dtype");
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm(x, weight);
  const int64_t n = x.size(-1);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  at::Tensor out = at::empty(x.sizes(), x.options());
  OCTAVO_DISPATCH(x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* xr = xp + row_offset(x, row);
        scale_row(op + row * n, xr, wp, n, inv_rms(xr, n, static_cast<float>(eps)));
      }
    });
  });
  return out;
}

void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                        double eps) {
  check_norm(x, weight);
  check_cpu(residual, "residual");
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous(),
              "fused_add_rms_norm: x and residual must be contiguous");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "fused_add_rms_norm: residual must match x");
  const int64_t n = x.size(-1);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  OCTAVO_DISPATCH(x.scalar_type(), "fused_add_rms_norm", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* rp = residual.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        scalar_t* xr = xp + row * n;
        scalar_t* rr = rp + row * n;
        for (int64_t i = 0; i < n; ++i) rr[i] = from_f<scalar_t>(to_f(xr[i]) + to_f(rr[i]));
        scale_row(xr, rr, wp, n, inv_rms(rr, n, static_cast<float>(eps)));
      }
    });
  });
}

}  // namespace octavo_cpu
