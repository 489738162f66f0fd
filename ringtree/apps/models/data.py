"""The corpus: the Python standard library's own top-level ``.py`` files, as characters.

Every machine with Python has it, so nothing is downloaded. The file list is fixed and
sorted (``sorted(glob(stdlib/*.py))``, top level only), so a given Python installation
always yields the same text; different Python versions ship different files, and the
corpus (not the code) changes with them.

- Vocabulary: 96 characters, ``"\\n"`` then printable ASCII 32..126 in order. Anything
  else (tabs, non-ASCII) becomes ``"?"``.
- Split: file ``j`` of the sorted list goes to validation when ``j % 10 == 9``, else to
  training (about 10 % of the files, spread over the alphabet).
- Batches: :func:`global_batch` draws ``batch_size`` windows of ``block_size + 1``
  characters at offsets from a generator seeded with ``(seed, split, step)``. The batch
  is the same on every rank and every parallel grid; a data-parallel rank takes its
  contiguous slice of sequences (:func:`shard_rows`), so the data order depends only on
  the seed and the global batch size.
"""

from __future__ import annotations

import functools
import glob
import os
import sysconfig

import numpy as np
import torch

VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(VOCAB)                        # 96
UNKNOWN = VOCAB.index("?")


def stdlib_files() -> list[str]:
    """The corpus files: top-level ``*.py`` of the standard library, sorted by path."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "*.py")))
    if not files:
        raise FileNotFoundError(f"no .py files in the standard library directory {root!r}")
    return files


_LUT = np.full(256, UNKNOWN, dtype=np.uint8)
for _i, _c in enumerate(VOCAB):
    _LUT[ord(_c)] = _i


def encode(text: str) -> np.ndarray:
    """Characters -> token ids (uint8)."""
    raw = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    return _LUT[raw]


def decode(ids) -> str:
    """Token ids -> characters."""
    return "".join(VOCAB[int(i)] for i in ids)


@functools.lru_cache(maxsize=1)
def corpus() -> dict[str, np.ndarray]:
    """``{"train": ids, "val": ids}``, each the concatenation of its files' ids."""
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    for j, path in enumerate(stdlib_files()):
        with open(path, encoding="utf-8", errors="replace") as f:
            ids = encode(f.read())
        parts["val" if j % 10 == 9 else "train"].append(ids)
    return {k: np.concatenate(v) for k, v in parts.items()}


def _split_seed(seed: int, split: str, step: int) -> int:
    return (seed * 1_000_003 + (0 if split == "train" else 7_919) + step * 104_729) % (1 << 62)


def global_batch(split: str, step: int, batch_size: int, block_size: int,
                 seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch for ``step``: inputs and next-character targets, (B, T) int64."""
    data = corpus()[split]
    g = torch.Generator().manual_seed(_split_seed(seed, split, step))
    starts = torch.randint(0, len(data) - block_size - 1, (batch_size,), generator=g).numpy()
    rows = np.stack([data[s:s + block_size + 1] for s in starts]).astype(np.int64)
    t = torch.from_numpy(rows)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def shard_rows(t: torch.Tensor, index: int, count: int) -> torch.Tensor:
    """Rows ``[index*B/count, (index+1)*B/count)`` of a batch (B must divide evenly)."""
    n = t.shape[0]
    if n % count:
        raise ValueError(f"batch of {n} sequences does not split into {count} equal parts")
    k = n // count
    return t[index * k:(index + 1) * k]
