// Rotary position embedding, NeoX style (rotate halves), in place on q and k.
//
// cos_sin_cache is float32 [positions, rot_dim]: cos of each frequency, then sin. The first
// rot_dim features of every head rotate: pairs (x[i], x[i + rot_dim / 2]).
#include "common.h"
#include "ops.h"

namespace octavo_cpu {
namespace {

// Rounded to T after each product, as the torch path computes x * cos + rotate(x) * sin in
// the tensor's dtype (a no-op for float32).
template <typename T>
inline float round_to(float x) {
  return to_f(from_f<T>(x));
}

template <typename T>
void rotate_heads(T* x, int64_t heads, int64_t head_stride, const float* cos,
                  const float* sin, int64_t half) {
  for (int64_t h = 0; h < heads; ++h) {
    T* x1 = x + h * head_stride;
    T* x2 = x1 + half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = to_f(x1[i]), b = to_f(x2[i]);
      const float c = round_to<T>(cos[i]), s = round_to<T>(sin[i]);
      x1[i] = from_f<T>(round_to<T>(a * c) - round_to<T>(b * s));
      x2[i] = from_f<T>(round_to<T>(b * c) + round_to<T>(a * s));
    }
  }
}

void check_heads(const at::Tensor& x, int64_t tokens, int64_t head_dim, const char* what) {
  check_cpu(x, what);
  TORCH_CHECK(x.dim() == 3 && x.size(0) == tokens && x.size(2) == head_dim &&
                  x.stride(2) == 1,
              "rotary_embedding: ", what, " must be [tokens, heads, head_dim] with a "
              "contiguous last dim");
}

}  // namespace

void rotary_embedding(const at::Tensor& positions, at::Tensor& q, at::Tensor& k,
                      const at::Tensor& cos_sin_cache, int64_t head_dim) {
  check_cpu(positions, "positions");
  check_cpu(cos_sin_cache, "cos_sin_cache");
  TORCH_CHECK(positions.dim() == 1 && positions.scalar_type() == at::kLong &&
                  positions.stride(0) == 1,
              "rotary_embedding: positions must be contiguous int64 [tokens]");
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.stride(1) == 1 &&
                  cos_sin_cache.scalar_type() == at::kFloat,
              "rotary_embedding: cos_sin_cache must be float32 [positions, rot_dim]");
  const int64_t tokens = positions.size(0);
  const int64_t rot_dim = cos_sin_cache.size(1);
  TORCH_CHECK(rot_dim % 2 == 0 && rot_dim <= head_dim, "rotary_embedding: bad rot_dim");
  check_heads(q, tokens, head_dim, "q");
  check_heads(k, tokens, head_dim, "k");
  TORCH_CHECK(k.scalar_type() == q.scalar_type(), "rotary_embedding: q/k dtypes differ");
  const int64_t half = rot_dim / 2;
  const int64_t max_pos = cos_sin_cache.size(0);
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "rotary_embedding: position ", pos[t],
                " outside the table (", max_pos, ")");
  }
  const float* cache = cos_sin_cache.data_ptr<float>();
  const int64_t cache_stride = cos_sin_cache.stride(0);
  const int64_t per_token = (q.size(1) + k.size(1)) * rot_dim;
  OCTAVO_DISPATCH(q.scalar_type(), "rotary_embedding", [&] {
    scalar_t* qp = q.data_ptr<scalar_t>();
    scalar_t* kp = k.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, row_grain(per_token), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* cos = cache + pos[t] * cache_stride;
        const float* sin = cos + half;
        rotate_heads(qp + t * q.stride(0), q.size(1), q.stride(1), cos, sin, half);
        rotate_heads(kp + t * k.stride(0), k.size(1), k.stride(1), cos, sin, half);
      }
    });
  });
}

}  // namespace octavo_cpu
