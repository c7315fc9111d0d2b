"""An on-disk cache of tokenizers converted from GGUF files.

transformers builds a GGUF file's tokenizer by parsing the whole file's metadata and
converting its vocabulary (seconds for a 49k-token vocabulary, on every start of the default
model). The converted tokenizer is saved once under the cache directory, keyed by the file's
resolved path, size and modification time, and loaded from there afterwards. Writes go to a
temporary folder renamed into place, so concurrent starts never read half a tokenizer; a cache
that cannot be written (read-only home) is skipped silently.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable

from octavo import envs

logger = logging.getLogger(__name__)

# Bump when what is stored changes (the build recipe in GGUFCheckpoint.load_tokenizer).
_FORMAT = 1


def cache_key(path: str) -> str:
    st = os.stat(path)
    ident = f"{_FORMAT}\0{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def cached_tokenizer(path: str, build: Callable[[], object]):
    """The tokenizer of GGUF file ``path``: from the cache when present, else ``build()``
    (then stored). OCTAVO_TOKENIZER_CACHE=0 always builds."""
    root = envs.cache_dir()
    if not envs.tokenizer_cache() or root is None:
        return build()
    from transformers import AutoTokenizer

    folder = os.path.join(root, "gguf-tokenizers", cache_key(path))
    if os.path.isdir(folder):
        try:
            return AutoTokenizer.from_pretrained(folder)
        except Exception as e:  # noqa: BLE001 - a damaged entry: rebuild it
            logger.warning("tokenizer cache %s unreadable (%s); rebuilding", folder, e)
            shutil.rmtree(folder, ignore_errors=True)
    tok = build()
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(folder), prefix=".tmp-")
        try:
            tok.save_pretrained(tmp)
            os.rename(tmp, folder)  # atomic; another start may have won the race
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        logger.debug("tokenizer cache not written (%s)", e)
    return tok
