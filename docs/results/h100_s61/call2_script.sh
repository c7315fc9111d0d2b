# Session 61 call 2 (tree 8e30c57 + e7c7edb): the 8-bit gated store's and the small-grid
# attention's GPU tests, then W8A16 with every layer in the swap-AB layout (gated store on / off)
# against the GEMV layout at every batch and W2.
export BUDGET=${BUDGET:-540}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=4 item t_glu timeout 240 python -m pytest -m gpu -q -rf -x tests/kernels/test_swapab_glu.py
TAILN=4 item t_attn timeout 120 python -m pytest -m gpu -q -rf tests/kernels/test_paged_attention_streamk.py -k "small_grid or engine_greedy"
OCTAVO_INT_WEIGHT_LAYOUT=swapab TAILN=3 item w8_sw python benchmarks/quantized.py --methods bf16,w8a16 --batches 1 16 64 256 --json /tmp/res/w8_sw.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_SWAPAB_GLU=0 TAILN=2 item w8_sw_noglu python benchmarks/quantized.py --methods w8a16 --batches 1 8 --skip-w2 --json /tmp/res/w8_sw_noglu.json
TAILN=2 item w8_def python benchmarks/quantized.py --methods w8a16 --batches 1 64 256 --json /tmp/res/w8_def.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_PDL=0 TAILN=3 item p_w8_sw_b1 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w8a16 --batch 1 --context 256 --json /tmp/res/p_w8_sw_b1.json
echo "=== end $(date +%T)"
