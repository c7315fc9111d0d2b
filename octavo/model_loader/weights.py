"""Iterate checkpoint tensors and feed them to a model: one generic loop for every family.

Checkpoint-specific renames live in ``NAME_REMAPS`` here, never in the models.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator

import torch
from torch import nn

# Checkpoint names we never load (buffers that we recompute).
_SKIP_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
# Loader-level renames: (old fragment, new fragment).
NAME_REMAPS: list[tuple[str, str]] = []


def iter_safetensors(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        bins = sorted(glob.glob(os.path.join(folder, "pytorch_model*.bin")))
        if not bins:
            raise ValueError(f"no *.safetensors or pytorch_model*.bin weights in {folder!r}")
        for path in bins:
            state = torch.load(path, map_location="cpu", weights_only=True)
            yield from state.items()
        return
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def checkpoint_names(folder: str) -> list[str] | None:
    """The tensor names of a safetensors checkpoint, read from the files' headers only (None
    for pytorch_model*.bin files, whose names cost a full load)."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        return None
    names: list[str] = []
    for path in files:
        with safe_open(path, framework="pt") as f:
            names.extend(f.keys())
    return names


def _default_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint "
                         f"{tuple(loaded.shape)}")
    param.data.copy_(loaded)


def _as_param_dtype(tensor: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """Float tensors take the parameter's float dtype; integer (packed, quantized) tensors
    must already be what the parameter holds: converting them would corrupt the packing."""
    if tensor.dtype == param.dtype:
        return tensor
    if tensor.is_floating_point() and param.is_floating_point():
        return tensor.to(param.dtype)
    raise ValueError(f"checkpoint dtype {tensor.dtype} does not fit the parameter's "
                     f"{param.dtype}: do the checkpoint's quantization and the one in use agree?")


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy checkpoint tensors into ``model`` using each parameter's ``weight_loader`` and the
    model's ``packed_modules_mapping``; errors name what is missing or unexpected."""
    params = dict(model.named_parameters(remove_duplicate=False))
    packed = getattr(model, "packed_modules_mapping", {})
    # name -> (parameter name, shard id) or None: a model's own mapping (stacked experts);
    # (new name, None) is a rename, which the packed mapping then places like any name.
    map_name = getattr(model, "map_checkpoint_name", None)
    tied = getattr(model, "tie_word_embeddings", False)
    loaded: set[str] = set()
    for name, tensor in weights:
        if name.endswith(_SKIP_SUFFIXES) or (tied and name.startswith("lm_head.")):
            continue
        for old, new in NAME_REMAPS:
            name = name.replace(old, new)
        shard_id = None
        target = name
        mapped = None if map_name is None else map_name(name)
        if mapped is not None and mapped[1] is None:
            target, mapped = mapped[0], None
        if mapped is not None:
            target, shard_id = mapped
        else:
            for frag, (param_frag, sid) in packed.items():
                if f".{frag}." in target:
                    target, shard_id = target.replace(f".{frag}.", f".{param_frag}."), sid
                    break
        param = params.get(target)
        if param is None:
            raise ValueError(f"checkpoint tensor {name!r} has no matching parameter")
        loader = getattr(param, "weight_loader", _default_loader)
        try:
            tensor = _as_param_dtype(tensor, param)
            if shard_id is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard_id)
        except ValueError as e:
            raise ValueError(f"checkpoint tensor {name!r} -> {target!r}: {e}") from e
        loaded.add(target if shard_id is None else f"{target}#{shard_id}")
    expected = set()
    for pname, param in params.items():
        if tied and pname.startswith("lm_head."):
            continue
        shards = getattr(param, "expected_shards", None)
        if shards is not None:  # every part of a stacked parameter
            expected.update(f"{pname}#{sid}" for sid in shards)
            continue
        frags = [(f, sid) for f, (pf, sid) in packed.items() if f".{pf}." in pname]
        if frags:
            expected.update(f"{pname}#{sid}" for _, sid in frags)
        else:
            expected.add(pname)
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:5]}")


def fill_dummy_weights(model: nn.Module, seed: int = 0, low: float = -1e-3,
                       high: float = 1e-3) -> None:
    """Random weights at the config's shape (load_format="dummy"); norms stay at one.
    Drawn on the parameters' own device: an 8B model drawn on the CPU takes minutes."""
    gens: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if "norm" in name:
            param.data.fill_(1.0)
            continue
        dev = param.device
        if dev not in gens:
            gens[dev] = torch.Generator(device=dev).manual_seed(seed)
        if param.dtype.itemsize == 1 and param.is_floating_point():
            # float8 (a pre-quantized FP8 checkpoint): torch draws no uniform float8, so
            # draw in float32 and round; +-1e-3 in e4m3 is 0 or +-2^-9
            draw = torch.empty(param.shape, dtype=torch.float32, device=dev)
            param.data.copy_(draw.uniform_(low, high, generator=gens[dev]))
        elif param.is_floating_point():
            param.data.uniform_(low, high, generator=gens[dev])
        else:  # packed quantized integers: any bit pattern is a valid weight
            param.data.random_(generator=gens[dev])
