"""A random-weight checkpoint of a benchmark shape, for engines that have no dummy-weight load
(``transformers serve``): config.json, safetensors shards and a word-level tokenizer.

Every engine of a comparison then loads the same folder, so they serve the same weights and
tokenize the same text to the same ids. The tokenizer spells token ``i`` as the word ``w{i}``
(token 0 is ``<unk>``), so a prompt of ``n`` words is exactly ``n`` tokens in every engine,
and ``ids_to_text`` turns the benchmark's token-id prompts into text prompts.

The config names no EOS token: a server that cannot ignore EOS (transformers serve refuses
the ``ignore_eos`` field) still produces ``max_tokens`` tokens for every request, whatever
random weights sample.
"""

from __future__ import annotations

import json
import math
import os
import tempfile

from benchmarks.workloads import SHAPES

MAX_SHARD_BYTES = 4 << 30


def ids_to_text(ids: list[int]) -> str:
    """The text that the word tokenizer of ``write_word_tokenizer`` encodes to ``ids``."""
    return " ".join("<unk>" if i == 0 else f"w{i}" for i in ids)


def write_word_tokenizer(folder: str, vocab_size: int) -> None:
    """A whitespace word-level tokenizer over the model's whole vocabulary, no special tokens
    but ``<unk>`` (id 0), no BOS added."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(folder)


def _init_tensor(name: str, shape: tuple[int, ...], dtype, device, gen):
    import torch

    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype, device=device)
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=dtype, device=device)
    t = torch.empty(shape, dtype=torch.float32, device=device)
    t.normal_(0.0, 0.02, generator=gen)
    return t.to(dtype)


def write_checkpoint(shape: str, dtype: str = "bfloat16", folder: str | None = None,
                     seed: int = 0, device: str | None = None) -> str:
    """Write the checkpoint into ``folder`` (a new temporary folder by default) and return it.
    Tensors are drawn on ``device`` (default: CUDA when present: an 8B model's 16 GB of random
    numbers take a minute on a CPU) and written shard by shard."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = folder or tempfile.mkdtemp(prefix=f"octavo-{shape}-ckpt-")
    os.makedirs(folder, exist_ok=True)
    cfg = {**SHAPES[shape], "torch_dtype": dtype, "bos_token_id": None, "eos_token_id": None,
           "pad_token_id": None}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        shapes.pop("lm_head.weight", None)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = getattr(torch, dtype)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    groups: list[list[str]] = [[]]  # tensor names per shard, in order
    size = 0
    for name, shp in shapes.items():
        nbytes = itemsize * math.prod(shp)
        if groups[-1] and size + nbytes > MAX_SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    files = ([f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
             if len(groups) > 1 else ["model.safetensors"])
    gen = torch.Generator(device=device).manual_seed(seed)
    for file, group in zip(files, groups):  # one shard in memory at a time
        shard = {k: _init_tensor(k, shapes[k], torch_dtype, device, gen).cpu() for k in group}
        save_file(shard, os.path.join(folder, file), metadata={"format": "pt"})
    if len(groups) > 1:
        total = sum(itemsize * math.prod(s) for s in shapes.values())
        weight_map = {k: file for file, group in zip(files, groups) for k in group}
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    write_word_tokenizer(folder, cfg["vocab_size"])
    return folder
