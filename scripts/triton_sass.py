"""Compile a Triton kernel for Hopper (sm_90) on a machine without a GPU and count the machine
instructions of its hot loop: how a kernel change moves instructions per weight, registers and
spills can be seen here before any device time is spent.

    python scripts/triton_sass.py octavo.kernels.w4a16_gemv:_int_weight_gemv_kernel \
        --const GROUP=128 FLUSH=128 BITS=4 BLOCK_M=1 BLOCK_N=256 BLOCK_P=16 PAIRED=0 PDL=0 \
        --ptr qw_ptr=i32 cnt_ptr=i32 part_ptr=fp32 --ones stride_qn \
        --num-warps 4 [--weights 32768] [--dump /tmp/out]
    python scripts/triton_sass.py octavo.kernels.w4a16_swapab:_swapab_kernel \
        --const GROUP=128 FOLD=128 BITS=4 MAGIC=1 ASM=1 BLOCK_M=16 BLOCK_R=64 BLOCK_K=128 \
        --ptr qw_ptr=i16 cnt_ptr=i32 part_ptr=fp32 \
        --ones stride_xk stride_sn stride_zn stride_on stride_pn \
        --div16 stride_qr stride_xm K K_PER_SPLIT stride_sg stride_zg stride_om stride_ps \
        stride_pm --num-warps 4 --weights 32768

Pointers default to bf16 and are taken as 16-byte aligned (as Triton specializes them at a
real launch); integer arguments are i32, ``--div16`` names those known to be multiples of 16,
``--ones`` those equal to 1 (Triton specializes both; leaving out a ``--div16`` that a real
launch would specialize can cost the loads their 16-byte vectors and cp.async pipelining,
which changes the loop completely). The loop reported is the largest basic block between
branch labels, or the sum of the blocks named by ``--loop`` (a loop that Triton split or
flattened, e.g. an inner loop with a fold after it: ``--blocks`` lists every block).
``--weights W`` (weights one pass over the loop handles, in the whole program) adds per-weight
rates, per thread: instructions, shared-memory traffic, MMAs. Uses the ptxas / nvdisasm /
cuobjdump that the triton package carries; the Triton version here may differ from the GPU
machine's.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import re
import subprocess
import sys


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _pairs(items):
    out = {}
    for item in items or ():
        key, _, value = item.partition("=")
        out[key] = value
    return out


def _blocks(sass: str):
    blocks, current, name = [], [], "entry"
    for line in sass.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line.strip())
        if label:
            blocks.append((name, current))
            current, name = [], label.group(1)
            continue
        op = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if op:
            current.append(op.group(1))
    blocks.append((name, current))
    return blocks


def compile_kernel(fn, const: dict, ptr_types: dict, div16: set, ones: set, num_warps: int,
                   num_stages: int = 3, floats: set = frozenset()):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    const = dict(const)
    const.update({name: 1 for name in ones})
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in const:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*" + ptr_types.get(name, "bf16")
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in floats:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name in div16:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn, signature, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def report(kernel, dump: str | None = None, loop: list[str] | None = None) -> dict:
    import triton

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    os.makedirs(dump or "/tmp/triton_sass", exist_ok=True)
    cubin = os.path.join(dump or "/tmp/triton_sass", "kernel.cubin")
    with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
    if dump:
        for key in ("ttgir", "ptx"):
            with open(os.path.join(dump, f"kernel.{key}"), "w") as f:
                f.write(kernel.asm[key])
    sass = subprocess.run([os.path.join(bindir, "nvdisasm"), "-c", cubin], capture_output=True,
                          text=True, check=True).stdout
    if dump:
        with open(os.path.join(dump, "kernel.sass"), "w") as f:
            f.write(sass)
    usage = subprocess.run([os.path.join(bindir, "cuobjdump"), "--dump-resource-usage", cubin],
                           capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    blocks = _blocks(sass)
    if loop:
        name = "+".join(loop)
        ops = [op for label, block in blocks if label in loop for op in block]
    else:
        name, ops = max(blocks, key=lambda b: len(b[1]))
    total = sum(len(block) for _, block in blocks)
    return {"registers": int(regs.group(1)) if regs else None,
            "local_bytes": int(local.group(1)) if local else None,
            "shared_bytes": kernel.metadata.shared, "instructions": total,
            "loop_label": name, "loop_instructions": len(ops),
            "loop_ops": dict(collections.Counter(ops).most_common()),
            "blocks": [(label, len(block)) for label, block in blocks]}


SHARED_OPS = ("STS", "LDS", "LDSM", "LDGSTS")
MMA_OPS = ("HGMMA", "HMMA")


def per_weight(r: dict, weights: int, num_warps: int) -> dict:
    """Per-thread rates for ``weights`` weights per pass over the loop."""
    per_thread = weights / (32 * num_warps)
    ops = r["loop_ops"]
    out = {"instructions": r["loop_instructions"] / per_thread}
    for op in SHARED_OPS + MMA_OPS:
        out[op] = ops.get(op, 0) / per_thread
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kernel", help="module:function of a @triton.jit kernel")
    p.add_argument("--const", nargs="*", help="NAME=VALUE constexpr arguments")
    p.add_argument("--ptr", nargs="*", help="NAME=TYPE pointer element types (default bf16)")
    p.add_argument("--div16", nargs="*", default=[], help="integer arguments divisible by 16")
    p.add_argument("--ones", nargs="*", default=[], help="integer arguments equal to 1")
    p.add_argument("--f32", nargs="*", default=[], help="float32 scalar arguments")
    p.add_argument("--num-warps", type=int, default=4)
    p.add_argument("--num-stages", type=int, default=3,
                   help="as the launch passes it (software pipelining of loads feeding dots)")
    p.add_argument("--dump", help="write kernel.{ttgir,ptx,sass} here")
    p.add_argument("--loop", nargs="*", help="labels of the blocks that make up the loop")
    p.add_argument("--blocks", action="store_true", help="list every block's size")
    p.add_argument("--weights", type=int,
                   help="weights per pass over the loop (whole program): per-weight rates")
    args = p.parse_args(argv)
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    module, _, fn_name = args.kernel.partition(":")
    fn = getattr(importlib.import_module(module), fn_name)
    const = {k: _value(v) for k, v in _pairs(args.const).items()}
    kernel = compile_kernel(fn, const, _pairs(args.ptr), set(args.div16), set(args.ones),
                            args.num_warps, args.num_stages, set(args.f32))
    r = report(kernel, args.dump, args.loop)
    print(f"registers {r['registers']}  local {r['local_bytes']} B  shared {r['shared_bytes']} B"
          f"  instructions {r['instructions']}")
    print(f"hot loop ({r['loop_label']}): {r['loop_instructions']} instructions")
    print("  " + "  ".join(f"{op} {n}" for op, n in r["loop_ops"].items()))
    if args.weights:
        rates = per_weight(r, args.weights, args.num_warps)
        print("per weight (per thread): " + "  ".join(
            f"{k} {v:.3f}" for k, v in rates.items() if v or k == "instructions"))
    if args.blocks:
        print("blocks: " + "  ".join(f"{label} {n}" for label, n in r["blocks"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
