. scripts/device_items.sh
TAILN=4 item gpu_tests python -m pytest -m gpu -q -rf tests/test_device_upload.py tests/kernels/test_sample_race.py
TAILN=5 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen.json
TAILN=45 item w1_pen_prof python -c "
import cProfile, pstats, sys
sys.argv = ['throughput.py', '--workload', 'W1', '--penalties']
sys.path.insert(0, 'benchmarks')
import runpy
cProfile.run(\"runpy.run_path('benchmarks/throughput.py', run_name='__main__')\", '/tmp/res/w1pen.prof')
pstats.Stats('/tmp/res/w1pen.prof').sort_stats('tottime').print_stats(35)
"
TAILN=6 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_base.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_MAX_M=16 TAILN=4 item q_sw16 python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_sw16.json
OCTAVO_PDL=0 TAILN=30 item prof_w4_b16 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w4a16 --batch 16 --context 128 --json /tmp/res/prof_w4_b16.json
echo "=== end $(date +%T)"
