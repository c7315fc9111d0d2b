. scripts/device_items.sh
TAILN=4 item gpu_tests python -m pytest -m gpu -q -rf tests/test_device_upload.py
TAILN=12 item sync_plain python benchmarks/host_syncs.py --json /tmp/res/sync_plain.json
TAILN=12 item sync_pen python benchmarks/host_syncs.py --penalties --logit-bias --min-tokens 8 --json /tmp/res/sync_pen.json
TAILN=12 item sync_n2 python benchmarks/host_syncs.py --n 2 --json /tmp/res/sync_n2.json
TAILN=5 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen.json
TAILN=6 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_base.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab TAILN=4 item q_swapab python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_swapab.json
OCTAVO_CUDA_KERNELS_MAX_M=16 TAILN=3 item q_cuda16 python benchmarks/quantized.py --methods w4a16 --batches 16 --skip-w2 --json /tmp/res/q_cuda16.json
for m in 1 16; do
TAILN=14 item g_up_m$m python benchmarks/gemv_scaling.py --k 4096 --n 4096 6144 28672 --m $m --kernels w4_gemv w4_mma w4_mma_w4 w4_mma_w8 w4_mma_w12 bf16_cublas --json /tmp/res/g_up_m$m.json
TAILN=14 item g_down_m$m python benchmarks/gemv_scaling.py --k 14336 --n 4096 --m $m --kernels w4_gemv w4_mma w4_mma_w4 w4_mma_w8 w4_mma_w12 bf16_cublas --json /tmp/res/g_down_m$m.json
done
echo "=== end $(date +%T)"
