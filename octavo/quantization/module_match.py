"""Does a layer's prefix fall under a checkpoint's list of modules left unquantized?

Lists come as AutoAWQ / bitsandbytes ``modules_to_not_convert`` (module names or name
fragments such as ``"lm_head"`` or ``"mlp.gate"``) and llm-compressor ``ignore`` (full names, or
``"re:<regex>"``). They name checkpoint modules (q_proj, k_proj ...), while our merged layers
have one prefix for several of them (qkv_proj): the model's ``packed_modules_mapping`` maps
between the two.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping


def matches_module(prefix: str, pattern: str) -> bool:
    """``pattern`` names ``prefix``: a ``re:`` regex matching all of it, or a run of whole
    dotted components of it ("layers.1" matches "model.layers.1.mlp", not "model.layers.10")."""
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], prefix) is not None
    return f".{pattern}." in f".{prefix}."


def checkpoint_modules(prefix: str, packed_modules_mapping: Mapping) -> list[str]:
    """The checkpoint module names behind our layer ``prefix``: q/k/v_proj for a qkv_proj."""
    head, _, last = prefix.rpartition(".")
    parts = [frag for frag, (param_frag, _) in packed_modules_mapping.items()
             if param_frag == last]
    if not parts:
        return [prefix]
    return [f"{head}.{frag}" if head else frag for frag in parts]


def is_ignored(prefix: str, patterns: Iterable[str], packed_modules_mapping: Mapping) -> bool:
    """Whether the layer at ``prefix`` stays unquantized; a merged layer whose parts disagree
    cannot be held by one method, so that is an error naming them."""
    patterns = list(patterns)
    if not patterns:
        return False
    parts = checkpoint_modules(prefix, packed_modules_mapping)
    ignored = [p for p in parts if any(matches_module(p, pat) for pat in patterns)]
    if ignored and len(ignored) != len(parts):
        kept = [p for p in parts if p not in ignored]
        raise ValueError(f"layer {prefix!r} merges {parts}: the checkpoint leaves {ignored} "
                         f"unquantized but not {kept}; a merged layer is quantized all or "
                         "nothing")
    return bool(ignored)
