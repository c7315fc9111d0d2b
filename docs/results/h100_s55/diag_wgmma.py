"""Dump the CUDA swap-AB kernel's outputs on the one-hot and integer tests (for analysis off
the device), in a fresh process so a trap elsewhere does not spoil it."""
import os
import sys
import torch
from octavo.kernels import swapab_wgmma
from octavo.kernels.w4a16_swapab import pack_swapab

out = {}
k, n, m = 256, 512, 200
kk = torch.arange(k)[:, None]
q = (kk + 5 * torch.arange(n)[None, :]) % 16
x = torch.zeros(m, k, dtype=torch.bfloat16)
x[torch.arange(m), (3 * torch.arange(m)) % k] = 1
scales = torch.ones(k // 64, n, dtype=torch.bfloat16)
zeros = torch.zeros(k // 64, n, dtype=torch.bfloat16)
got = swapab_wgmma.swapab_wgmma(x.cuda(), pack_swapab(q, 4).cuda(), scales.cuda(),
                                zeros.cuda(), 64, split_k=1)
torch.cuda.synchronize()
out["onehot"] = got.cpu()
# x = identity-ish: row m picks k = m (m < 64), weight value = k-index pattern per column
k, n, m = 64, 256, 64
q = (torch.arange(k)[:, None] * 0 + torch.arange(n)[None, :]) % 16
x = torch.eye(m, k, dtype=torch.bfloat16)
got = swapab_wgmma.swapab_wgmma(x.cuda(), pack_swapab(q, 4).cuda(),
                                torch.ones(1, n, dtype=torch.bfloat16).cuda(),
                                torch.zeros(1, n, dtype=torch.bfloat16).cuda(), 64, split_k=1)
torch.cuda.synchronize()
out["eye_colpattern"] = got.cpu()
q2 = (torch.arange(k)[:, None] + 0 * torch.arange(n)[None, :]) % 16
got = swapab_wgmma.swapab_wgmma(x.cuda(), pack_swapab(q2, 4).cuda(),
                                torch.ones(1, n, dtype=torch.bfloat16).cuda(),
                                torch.zeros(1, n, dtype=torch.bfloat16).cuda(), 64, split_k=1)
torch.cuda.synchronize()
out["eye_rowpattern"] = got.cpu()
torch.save(out, os.path.join(os.environ["OUT"], "diag_wgmma.pt"))
print({k: (v.shape, v.float().abs().sum().item()) for k, v in out.items()})
