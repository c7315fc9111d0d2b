// The 16-bit weights' kernels of dense_mma.cuh.

#include "dense_mma.cuh"

// (MT, NT, STEPS) built: octavo/kernels/dense_mma.py's VARIANTS, those whose two chunks of
// operands in registers ((2 NT + MT) STEPS uint4, twice) fit in 255 registers without spills
// (ptxas for sm_90, bf16 and fp16 alike; m2_n1_s8, m1_n2_s8 and m4_n2_s4 spilled 144-784 bytes).
#define OCTAVO_DENSE_MMA_ALL(TNAME, T) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 1, 1, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 1, 1, 2) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 1, 1, 4) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 1, 1, 8) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 1, 2, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 1, 2, 2) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 1, 2, 4) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 2, 1, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 2, 1, 2) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 2, 1, 4) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 2, 2, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 2, 2, 2) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 2, 2, 4) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 4, 1, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 4, 1, 2) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 4, 1, 4) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 4, 2, 1) \
  OCTAVO_DENSE_MMA(TNAME, T, , T, 4, 2, 2)

OCTAVO_DENSE_MMA_ALL(bf16, __nv_bfloat16)
OCTAVO_DENSE_MMA_ALL(f16, __half)
