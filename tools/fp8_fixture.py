#!/usr/bin/env python3
"""A fine-grained FP8 fixture made from a bf16 one, with numpy only (no torch).

    python3 tools/fp8_fixture.py weights SRC DST [--block R C]
        Quantizes the linear weights of SRC (a Qwen3.5-MoE fixture, VLM layout) to e4m3 with one
        fp32 scale per R x C block (default 128 x 128), as transformers' fine-grained FP8 quantizer
        does (block max -> scale 448 / max, clamp, round to nearest even, weight_scale_inv =
        1 / scale), with edge blocks partial as transformers' FP8Linear reads them. Experts are
        written one tensor per expert, as Qwen's released FP8 checkpoints hold them; embeddings,
        lm_head, routers, the shared-expert gate, mtp.* and model.visual.* stay bf16 and are listed
        in modules_to_not_convert. Writes DST/config.json, DST/model.safetensors (laid out as
        safetensors' own writer lays files out) and DST/reference.json (SRC's prompt).

    python3 tools/fp8_fixture.py dequantized DST OUT
        Writes OUT, the same model with every fp8 weight replaced by its fp32 dequantized value
        (code value x block scale, one fp32 product) and no quantization_config: a plain
        checkpoint whose logits are the reference for DST.

    python3 tools/fp8_fixture.py reference DST PETREL
        Makes that plain checkpoint in a temporary folder and runs the petrel binary PETREL on it
        (CPU, the fp32 path the bf16/f32 fixtures hold to Hugging Face): DST/logits.npy (every
        prompt position) and the 24-token greedy continuation in DST/reference.json.

tools/make_fp8_fixture.py does the same quantization with torch and the reference with
transformers, on a machine that has them.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

FP8_MAX = np.float32(448.0)
GEN_TOKENS = 24
SIZES = {"F32": 4, "I32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1}
# safetensors' writer orders tensors by dtype (its enum order, descending), then by name.
DTYPE_ORDER = {"F8_E4M3": 0, "F16": 1, "BF16": 2, "I32": 3, "F32": 4}


# ---------------------------------------------------------------------------------------- e4m3

def e4m3_values():
    """The value of every code 0..255 (NaN for 0x7f and 0xff), as fp32."""
    codes = np.arange(256)
    exp, mant = (codes >> 3) & 0xF, codes & 0x7
    mag = np.where(exp == 0, mant * 2.0 ** -9, (8 + mant) * 2.0 ** (exp.astype(np.float64) - 10))
    mag[(exp == 0xF) & (mant == 0x7)] = np.nan
    return np.where(codes & 0x80, -mag, mag).astype(np.float32)


VALUES = e4m3_values()


def to_e4m3(x):
    """fp32 in [-448, 448] -> e4m3 codes, round to nearest, ties to the even code (torch's cast)."""
    pos = VALUES[:127].astype(np.float64)  # codes 0..126: every finite non-negative value, increasing
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(pos, a, side="left"), 1, 126)
    lo = hi - 1
    d_lo, d_hi = a - pos[lo], pos[hi] - a
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= pos[126], 126, code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def quantize(w, block):
    """[..., rows, cols] fp32 -> (e4m3 codes, fp32 inverse scales [..., ceil(rows/R), ceil(cols/C)])."""
    R, C = block
    rows, cols = w.shape[-2:]
    gr, gc = -(-rows // R), -(-cols // C)
    padded = np.zeros((*w.shape[:-2], gr * R, gc * C), np.float32)   # zeros never raise a block max
    padded[..., :rows, :cols] = w
    tiles = padded.reshape(*w.shape[:-2], gr, R, gc, C)
    amax = np.abs(tiles).max(axis=(-3, -1))
    scale = np.where(amax > 0, FP8_MAX / np.where(amax > 0, amax, np.float32(1)), np.float32(1)).astype(np.float32)
    scaled = (tiles * scale[..., :, None, :, None]).astype(np.float32)
    codes = to_e4m3(np.clip(scaled, -FP8_MAX, FP8_MAX)).reshape(padded.shape)[..., :rows, :cols]
    return np.ascontiguousarray(codes), (np.float32(1) / scale).astype(np.float32)


def dequantize(codes, inv, block):
    R, C = block
    rows, cols = codes.shape[-2:]
    s = np.repeat(np.repeat(inv, R, axis=-2), C, axis=-1)[..., :rows, :cols]
    return (VALUES[codes] * s).astype(np.float32)


# ---------------------------------------------------------------------------------------- safetensors

def read_safetensors(path):
    """name -> (dtype string, numpy array of the stored bits: uint16 for BF16, uint8 for F8)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "I32": np.int32, "F16": np.float16, "BF16": np.uint16, "F8_E4M3": np.uint8}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], np.frombuffer(data[a:b], dtype=kinds[t["dtype"]]).reshape(t["shape"]))
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, array), written as safetensors' writer does."""
    names = sorted(tensors, key=lambda k: (-DTYPE_ORDER[tensors[k][0]], k))
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in names:
        dtype, arr = tensors[name]
        size = arr.size * SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + size]}
        offset += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name][1]).tobytes())


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------------------- layout

KEPT = ("lm_head", "model.visual", "mtp")   # modules_to_not_convert besides the routers


def not_converted(cfg):
    layers = cfg["text_config"]["num_hidden_layers"]
    out = list(KEPT)
    for i in range(layers):
        out += [f"model.language_model.layers.{i}.mlp.gate", f"model.language_model.layers.{i}.mlp.shared_expert_gate"]
    return out


def split_experts(tensors, moe_i):
    """Fused gate_up_proj [E, 2I, H] / down_proj [E, H, I] -> one tensor per expert (released layout)."""
    out = {}
    for k, v in tensors.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            for e in range(v[1].shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = (v[0], v[1][e, :moe_i])
                out[f"{base}{e}.up_proj.weight"] = (v[0], v[1][e, moe_i:])
        elif k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v[1].shape[0]):
                out[f"{base}{e}.down_proj.weight"] = (v[0], v[1][e])
        else:
            out[k] = v
    return out


def converted(name, skip):
    """Whether transformers' FP8 replacement turns `name` (a weight) into fp8: a Linear's weight
    outside modules_to_not_convert. Embeddings, norms, convs and vectors are no Linear."""
    if not name.endswith(".weight") or "embed_tokens" in name or "norm" in name or "conv1d" in name:
        return False
    module = name[: -len(".weight")]
    return not any(module == s or module.startswith(s + ".") for s in skip)


def make_weights(src, dst, block):
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    tensors = split_experts(read_safetensors(os.path.join(src, "model.safetensors")),
                            cfg["text_config"]["moe_intermediate_size"])
    skip = not_converted(cfg)
    out = {}
    for name, (dtype, arr) in tensors.items():
        if not converted(name, skip):
            out[name] = (dtype, arr)
            continue
        assert dtype == "BF16" and arr.ndim == 2, (name, dtype, arr.shape)
        codes, inv = quantize(bf16_to_f32(arr), block)
        out[name] = ("F8_E4M3", codes)
        out[name + "_scale_inv"] = ("F32", inv)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(block), "modules_to_not_convert": skip}
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    write_safetensors(os.path.join(dst, "model.safetensors"), out)
    with open(os.path.join(src, "reference.json")) as f:
        prompt = json.load(f)["prompt_ids"]
    ref = {"prompt_ids": prompt,
           "reference": "petrel CPU (its HF-verified F32 path) on the dequantized weights as a plain "
                        "checkpoint: tools/fp8_fixture.py reference (dump-logits; run --temperature 0)"}
    with open(os.path.join(dst, "reference.json"), "w") as f:
        json.dump(ref, f)
    n = sum(1 for d, _ in out.values() if d == "F8_E4M3")
    print(f"wrote {dst}: {len(out)} tensors, {n} in fp8 with {block[0]}x{block[1]} block scales")


def make_dequantized(dst, out_dir):
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    block = cfg.pop("quantization_config")["weight_block_size"]
    tensors = read_safetensors(os.path.join(dst, "model.safetensors"))
    out = {}
    for name, (dtype, arr) in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if dtype == "F8_E4M3":
            out[name] = ("F32", dequantize(arr, tensors[name + "_scale_inv"][1], block))
        else:
            out[name] = (dtype, arr)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), out)
    print(f"wrote {out_dir}: {len(out)} tensors")


def make_reference(dst, petrel):
    with open(os.path.join(dst, "reference.json")) as f:
        ref = json.load(f)
    ids = ",".join(str(i) for i in ref["prompt_ids"])
    with tempfile.TemporaryDirectory() as tmp:
        plain = os.path.join(tmp, "dequantized")
        make_dequantized(dst, plain)
        subprocess.run([petrel, "dump-logits", plain, "--device", "cpu", "--prompt-ids", ids,
                        "--out", os.path.join(dst, "logits.npy")], check=True)
        out = subprocess.run([petrel, "run", plain, "--device", "cpu", "--prompt-ids", ids, "-n", str(GEN_TOKENS),
                              "--temperature", "0", "--ignore-eos", "--output-ids"],
                             check=True, capture_output=True, text=True).stdout
    ref["greedy_ids"] = [int(t) for t in out.split()]
    assert len(ref["greedy_ids"]) == GEN_TOKENS, out
    with open(os.path.join(dst, "reference.json"), "w") as f:
        json.dump(ref, f)
    print(f"wrote {dst}/logits.npy and greedy {ref['greedy_ids'][:8]}...")


def main():
    args = sys.argv[1:]
    if len(args) in (3, 6) and args[0] == "weights" and (len(args) == 3 or args[3] == "--block"):
        block = (int(args[4]), int(args[5])) if len(args) == 6 else (128, 128)
        if os.path.isdir(args[2]):
            shutil.rmtree(args[2])
        make_weights(args[1], args[2], block)
    elif len(args) == 3 and args[0] == "dequantized":
        make_dequantized(args[1], args[2])
    elif len(args) == 3 and args[0] == "reference":
        make_reference(args[1], args[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
