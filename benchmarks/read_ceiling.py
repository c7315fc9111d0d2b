"""How fast can this GPU read the bytes decode attention reads? The ceiling of each access
pattern, with no attention arithmetic and perfectly balanced programs, next to the decode
attention kernel on a W1-like cache of the same size.

PYTHONPATH=. python benchmarks/read_ceiling.py [--mb 1100] [--requests 128] [--json out.json]

Patterns (each reads every byte of a K and a V cache once, programs = requests x KV heads as
in a W1 batch-128 step, every program the same number of blocks; one CUDA graph replays the
reads over enough cache copies that L2 holds none of them; CUDA events):

- ``stream``: each program reads a contiguous range (the best case for DRAM).
- ``blocks``: each program reads whole 16-token cache blocks (all KV heads, 32 KB for K and
  32 KB for V at Qwen3's 8 x 128 bf16) from a shuffled block table.
- ``rows``: the attention pattern: a program = (request, KV head) reads its head's 256-byte
  rows of 16 tokens per block (rows 2 KB apart) of its shuffled blocks, ``BLOCK_N`` tokens
  per iteration, as the Triton decode kernel does.
- ``attention``: ``octavo.kernels.paged_attention`` itself on the same cache, every request
  the same context (no tails).

Figures: us per pass and TB/s (fraction of the published HBM rate). The decode kernel's
fraction of the ``rows`` ceiling is how much an attention kernel could still gain on this
cache layout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import graph_median_ms, published_hbm_tbps  # noqa: E402
from octavo.kernels.paged_attention import paged_attention
from octavo.kernels.triton_utils import tl, triton


@triton.jit
def _read_stream(src, out, per_prog, CHUNK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    base = src + pid.to(tl.int64) * per_prog
    offs = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for i in tl.range(0, per_prog, CHUNK, num_stages=STAGES):
        acc += tl.load(base + i + offs).to(tl.float32)
    tl.store(out + pid, tl.sum(acc))


@triton.jit
def _read_blocks(k, v, table, out, blocks_per_prog, BLOCK_ELEMS: tl.constexpr,
                 CHUNK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for j in tl.range(0, blocks_per_prog, num_stages=STAGES):
        blk = tl.load(table + pid * blocks_per_prog + j).to(tl.int64)
        for c in tl.static_range(0, BLOCK_ELEMS, CHUNK):
            acc += tl.load(k + blk * BLOCK_ELEMS + c + offs).to(tl.float32)
            acc += tl.load(v + blk * BLOCK_ELEMS + c + offs).to(tl.float32)
    tl.store(out + pid, tl.sum(acc))


@triton.jit
def _read_rows(k, v, table, out, blocks_per_req, heads, stride_b, stride_t,
               BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
               STAGES: tl.constexpr):
    req = tl.program_id(0)
    head = tl.program_id(1)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    row = table + req * blocks_per_req
    for start in tl.range(0, blocks_per_req * BLOCK_SIZE, BLOCK_N, num_stages=STAGES):
        n = start + offs_n
        blk = tl.load(row + n // BLOCK_SIZE).to(tl.int64)
        tok = blk * stride_b + (n % BLOCK_SIZE).to(tl.int64) * stride_t + head * D
        acc += tl.load(k + tok[:, None] + offs_d[None, :]).to(tl.float32)
        acc += tl.load(v + tok[:, None] + offs_d[None, :]).to(tl.float32)
    tl.store(out + req * heads + head, tl.sum(acc))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1100,
                    help="K + V bytes per pass (MB; 1,100: contexts of 1,024 at 128 requests)")
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--stages", nargs="*", type=int, default=[2, 3, 4])
    ap.add_argument("--json")
    args = ap.parse_args()
    name = torch.cuda.get_device_name()
    peak = published_hbm_tbps(name)
    bs, d, hkv, reqs = 16, 128, args.kv_heads, args.requests
    block_bytes = bs * hkv * d * 2
    # A multiple of the KV heads, so the ``blocks`` pattern's programs get whole blocks.
    blocks_per_req = max(hkv, args.mb * 10**6 // (2 * block_bytes * reqs) // hkv * hkv)
    nblocks = blocks_per_req * reqs
    pass_bytes = 2 * nblocks * block_bytes
    copies = max(2, -(-(800 << 20) // pass_bytes))
    gen = torch.Generator(device="cuda").manual_seed(0)
    ks = [torch.randn(nblocks, bs, hkv, d, device="cuda", dtype=torch.bfloat16,
                      generator=gen) for _ in range(copies)]
    vs = [torch.randn_like(k) for k in ks]
    table = torch.randperm(nblocks, device="cuda", generator=gen).to(torch.int32)
    out = torch.empty(reqs * hkv, device="cuda", dtype=torch.float32)
    programs = reqs * hkv
    rows = []

    def report(pattern, cfg, ms):
        tbps = pass_bytes / (ms / copies) / 1e9
        row = {"pattern": pattern, "config": cfg, "us": ms / copies * 1e3, "tbps": tbps,
               "of_peak": tbps / peak if peak else None}
        rows.append(row)
        frac = f" ({tbps / peak:.0%} of HBM)" if peak else ""
        print(f"{pattern:10s} {cfg:28s} {row['us']:8.1f} us  {tbps:.2f} TB/s{frac}", flush=True)

    elems = nblocks * block_bytes // 2
    per_prog = elems // programs
    for stages in args.stages:
        for chunk in (2048, 4096):
            def run(chunk=chunk, stages=stages):
                for i in range(copies):
                    _read_stream[(programs,)](ks[i], out, per_prog, CHUNK=chunk, STAGES=stages)
                    _read_stream[(programs,)](vs[i], out, per_prog, CHUNK=chunk, STAGES=stages)
            report("stream", f"chunk {chunk} stages {stages}", graph_median_ms(run))
    for stages in args.stages:
        for chunk in (2048, 4096):
            def run(chunk=chunk, stages=stages):
                for i in range(copies):
                    _read_blocks[(programs,)](ks[i], vs[i], table, out, nblocks // programs,
                                              BLOCK_ELEMS=block_bytes // 2, CHUNK=chunk,
                                              STAGES=stages)
            report("blocks", f"chunk {chunk} stages {stages}", graph_median_ms(run))
    for stages in args.stages:
        for block_n in (64, 128):
            def run(block_n=block_n, stages=stages):
                for i in range(copies):
                    _read_rows[(reqs, hkv)](ks[i], vs[i], table, out, blocks_per_req, hkv,
                                            ks[i].stride(0), ks[i].stride(1), BLOCK_SIZE=bs,
                                            BLOCK_N=block_n, D=d, STAGES=stages)
            report("rows", f"block_n {block_n} stages {stages}", graph_median_ms(run))
    # The decode kernel itself: every request the same context over the same shuffled blocks.
    ctx = blocks_per_req * bs
    q = torch.randn(reqs, args.heads, d, device="cuda", dtype=torch.bfloat16)
    qsl = torch.arange(reqs + 1, dtype=torch.int32, device="cuda")
    sl = torch.full((reqs,), ctx, dtype=torch.int32, device="cuda")
    bt = table.view(reqs, blocks_per_req)
    o = torch.empty_like(q)

    def attn():
        for i in range(copies):
            paged_attention(q, ks[i], vs[i], qsl, sl, bt, d ** -0.5, out=o, max_query_len=1,
                            max_seq_len=4096)
    report("attention", f"context {ctx}", graph_median_ms(attn))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "peak_tbps": peak, "pass_bytes": pass_bytes,
                       "requests": reqs, "kv_heads": hkv, "context": ctx, "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
