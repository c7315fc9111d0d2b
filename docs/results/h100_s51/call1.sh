. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python -c "import torch; from octavo.kernels import swapab_mma as s; d=torch.device('cuda'); print('CTA shared limit', getattr(torch.cuda.get_device_properties(d), 'shared_memory_per_block_optin', None), s._shared_limit(d), 'staged warps m1 p3', s.staged_warps(1, 4, 4, 3, 8, s._shared_limit(d)))"
# Session 50's GPU-only test written after its device time: no race-kernel compile after the profile.
TAILN=4 item t_profile python -m pytest -m gpu -q -rf tests/test_sampler_profile.py tests/quantization/test_int_weight_layout.py tests/kernels/test_swapab_mma.py -k "sampler or no_draw or 16_row_launches or writes_into_rows or past_16_rows or matches_the_float64 or split_and_cta"
TAILN=4 item t_dense python -m pytest -m gpu -q -rf tests/kernels/test_dense_mma.py tests/kernels/test_dense_mma_fp8.py
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
OCTAVO_PDL=0 TAILN=14 item prof_q32 python benchmarks/profile_step.py --shape qwen3-0.6b --batch 32 --context 256 --json /tmp/res/prof_q32.json
TAILN=6 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
TAILN=9 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen.json
TAILN=9 item w1_lp python benchmarks/throughput.py --workload W1 --logprobs 5 --json-out /tmp/res/w1_lp.json
TAILN=8 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 32 64 128 --skip-w2 --json /tmp/res/q_base.json
echo "=== end $(date +%T)"
