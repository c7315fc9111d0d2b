# Session 47 calls 3-6: four short commands on the warm H100 after call 2 (the budget's last
# ~270 s), each sourcing scripts/device_items.sh; their files are call3_*.
python benchmarks/quantized.py --methods nf4 --batches 4 --skip-w2                    # dq: dequantize-then-cuBLAS (MAX_M 2)
env OCTAVO_BNB4_CUDA_MAX_M=4 OCTAVO_BNB4_CUDA_AHEAD=8 python benchmarks/quantized.py --methods nf4 --batches 4 --skip-w2   # a8
env OCTAVO_BNB4_CUDA_MAX_M=8 OCTAVO_BNB4_CUDA_AHEAD=8 python benchmarks/quantized.py --methods nf4 --batches 2 8 --skip-w2 # a8_28
env OCTAVO_BNB4_CUDA_AHEAD=4 python benchmarks/quantized.py --methods nf4 --batches 1 3 --skip-w2                         # b1_a4 (3: MAX_M 2, dequantized)
env OCTAVO_BNB4_CUDA_MAX_M=8 OCTAVO_BNB4_CUDA_AHEAD=1 python benchmarks/quantized.py --methods nf4 --batches 1 3 --skip-w2 # b1_a1
env OCTAVO_BNB4_CUDA_MAX_M=8 OCTAVO_BNB4_CUDA_AHEAD=8 python benchmarks/quantized.py --methods nf4 --batches 3 6 --skip-w2 # b3_a8
