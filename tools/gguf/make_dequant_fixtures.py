#!/usr/bin/env python3
"""Writes the GGUF dequantization fixtures: rows of each ggml type Petrel decodes, and what
gguf-py's `gguf.quants.dequantize` makes of them, which Petrel must match bit for bit
(tests/unit/gguf_quants_test.cpp).

Needs numpy (Debian: python3-numpy) and llama.cpp's gguf-py, by default the copy in the shared
folder beside the repository (shared/third_party/llama.cpp-gguf/gguf-py):

    python3 tools/gguf/make_dequant_fixtures.py [--gguf-py DIR] [--out tests/fixtures/gguf/dequant]

For each type T it writes T.bin (ROWS rows of raw blocks as a GGUF file stores them) and T.npy
(float32 [ROWS, row length]: gguf-py's output). Quantized blocks are random bytes with their f16
scale fields replaced by finite values (normal, subnormal, negative, zero), so that the outputs
are finite; F16 and BF16 rows are random bit patterns, NaN and infinity included. A fixed seed
makes the files reproducible.
"""
import argparse
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_GGUF_PY = os.path.join(os.path.dirname(REPO), "shared", "third_party", "llama.cpp-gguf", "gguf-py")

ROWS = 4
# Type -> (blocks per row, byte offsets of its f16 scale fields within a block).
TYPES = {
    "F32": (64, []),
    "F16": (64, []),
    "BF16": (64, []),
    "Q4_0": (8, [0]),
    "Q4_1": (8, [0, 2]),
    "Q5_0": (8, [0]),
    "Q5_1": (8, [0, 2]),
    "Q8_0": (8, [0]),
    "Q2_K": (2, [80, 82]),
    "Q3_K": (2, [108]),
    "Q4_K": (2, [0, 2]),
    "Q5_K": (2, [0, 2]),
    "Q6_K": (2, [208]),
    "IQ4_NL": (8, [0]),
    "IQ4_XS": (2, [0]),
}


def scale_values(rng, n):
    """n finite f16 scales: mostly small normal values of either sign, some subnormal, some zero."""
    v = rng.normal(0.0, 0.02, n).astype(np.float16)
    kind = rng.integers(0, 10, n)
    v = np.where(kind == 0, np.float16(0.0), v)
    subnormal = (rng.integers(1, 1024, n).astype(np.uint16) | (rng.integers(0, 2, n).astype(np.uint16) << 15))
    v = np.where(kind == 1, subnormal.view(np.float16), v)
    return v


def make_rows(rng, qtype, gguf):
    blocks_per_row, scale_offsets = TYPES[qtype]
    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    n_blocks = ROWS * blocks_per_row
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    if qtype == "F32":
        # Random finite floats, plus the specials: a random bit pattern is mostly huge or tiny.
        vals = rng.normal(0.0, 1.0, n_blocks).astype(np.float32)
        vals[:6] = [np.inf, -np.inf, np.nan, -0.0, 1e-45, -3e38]
        raw = vals.view(np.uint8).reshape(n_blocks, 4)
    for off in scale_offsets:
        raw[:, off:off + 2] = scale_values(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(ROWS, blocks_per_row * type_size), blocks_per_row * block


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf-py", default=DEFAULT_GGUF_PY, help="folder holding gguf-py's gguf package")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "gguf", "dequant"))
    ap.add_argument("--seed", type=int, default=20240611)
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(args.gguf_py, "gguf")):
        sys.exit(f"{args.gguf_py}: no gguf package there; pass --gguf-py DIR (llama.cpp's gguf-py folder)")
    sys.path.insert(0, args.gguf_py)
    import gguf  # noqa: E402  (found through --gguf-py)

    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for qtype in TYPES:
        rows, n = make_rows(rng, qtype, gguf)
        out = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType[qtype])
        out = np.ascontiguousarray(out, dtype=np.float32).reshape(ROWS, n)
        assert qtype in ("F16", "BF16", "F32") or np.isfinite(out).all(), qtype
        rows.tofile(os.path.join(args.out, qtype + ".bin"))
        np.save(os.path.join(args.out, qtype + ".npy"), out)
        print(f"{qtype}: {ROWS} rows of {n} elements, {rows.nbytes} bytes")


if __name__ == "__main__":
    main()
