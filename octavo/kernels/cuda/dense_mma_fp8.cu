// The float8 weights' kernels of dense_mma.cuh.

#include "dense_mma.cuh"

// Float8 weights (one feature tile per warp): octavo/kernels/dense_mma.py's FP8_VARIANTS.
#define OCTAVO_DENSE_MMA_E4M3(TNAME, T)              \
  OCTAVO_DENSE_MMA(TNAME, T, _e4m3, E4m3, 1, 1, 1)   \
  OCTAVO_DENSE_MMA(TNAME, T, _e4m3, E4m3, 1, 1, 2)   \
  OCTAVO_DENSE_MMA(TNAME, T, _e4m3, E4m3, 1, 1, 4)   \
  OCTAVO_DENSE_MMA(TNAME, T, _e4m3, E4m3, 2, 1, 1)   \
  OCTAVO_DENSE_MMA(TNAME, T, _e4m3, E4m3, 2, 1, 2)   \
  OCTAVO_DENSE_MMA(TNAME, T, _e4m3, E4m3, 2, 1, 4)   \
  OCTAVO_DENSE_MMA(TNAME, T, _e4m3, E4m3, 4, 1, 1)   \
  OCTAVO_DENSE_MMA(TNAME, T, _e4m3, E4m3, 4, 1, 2)

OCTAVO_DENSE_MMA_E4M3(bf16, __nv_bfloat16)
OCTAVO_DENSE_MMA_E4M3(f16, __half)
