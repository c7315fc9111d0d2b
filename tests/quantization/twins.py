"""Checkpoint twins for quantization tests: one source checkpoint's files written out again
with other tensors (a dense float twin beside a packed quantized one), and config patches."""

from __future__ import annotations

import json
import os
import shutil

import torch


def write_twins(src: str, root: str, twins: dict[str, dict[str, torch.Tensor]]) -> list[str]:
    """For each (subfolder, tensors): a copy of ``src``'s non-safetensors files (config,
    tokenizer) with ``tensors`` as its model.safetensors; the folders, in order."""
    from safetensors.torch import save_file

    out = []
    for sub, tensors in twins.items():
        folder = os.path.join(root, sub)
        os.makedirs(folder)
        for name in os.listdir(src):
            if not name.endswith(".safetensors"):
                shutil.copy(os.path.join(src, name), folder)
        save_file(tensors, os.path.join(folder, "model.safetensors"))
        out.append(folder)
    return out


def patch_config(folder: str, **fields) -> None:
    """Set ``fields`` in ``folder``'s config.json."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(fields)
    with open(path, "w") as f:
        json.dump(cfg, f)
