#!/usr/bin/env python3
"""GPTQ and AWQ fixtures made from a bf16 one, with numpy only (no torch).

    python3 tools/quant4_fixture.py weights SRC DST VARIANT GROUP
        Quantizes the linear weights of SRC (a fixture with one tensor per expert) with
        round-to-nearest group-wise integer codes over GROUP input features and writes them in
        the layout VARIANT names:
          gptq4     GPTQ 4-bit, asymmetric, checkpoint_format "gptq" (zero points stored less 1)
          gptq4sym  GPTQ 4-bit, symmetric (zero points 8), checkpoint_format "gptq", as Qwen's -GPTQ-Int4
          gptq8v2   GPTQ 8-bit, symmetric, checkpoint_format "gptq_v2" (zero points as they are)
          awq4      AWQ gemm 4-bit with zero points
        GPTQ: qweight int32 [in * bits / 32, out], input features packed low bits first;
        qzeros int32 [groups, out * bits / 32], output features packed low bits first; scales
        f16 [groups, out]; g_idx int32 [in]. AWQ: qweight int32 [in, out / 8] and qzeros int32
        [groups, out / 8], nibble k of a word holding output feature 8w + (0, 2, 4, 6, 1, 3, 5, 7)[k];
        scales f16 [groups, out]. A weight is scale * (code - zero). Embeddings, lm_head, norms and
        routers stay unquantized, in f16 as released GPTQ/AWQ checkpoints hold them. Writes
        DST/config.json, DST/model.safetensors and DST/reference.json (SRC's prompt).

    python3 tools/quant4_fixture.py reference DST PETREL
        Writes the same model with every quantized weight replaced by its f32 value (computed here
        from the unpacked codes) as a plain checkpoint in a temporary folder and runs the petrel
        binary PETREL on it (CPU): DST/logits.npy, every prompt position.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_fixture import bf16_to_f32, read_safetensors, write_safetensors  # noqa: E402

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]   # output offset held by nibble k of an AWQ word


def quantized(name, rows, bits):
    """A Linear's weight that GPTQ/AWQ replace: a projection (routers and the shared-expert gate
    stay) whose output features fill whole int32 words (Qwen3.5's 4-row in_proj_a/b stay)."""
    return "_proj" in name and name.endswith(".weight") and rows % (32 // bits) == 0


def quantize(w, bits, group, sym):
    """[out, in] f32 -> codes [out, in], zeros [out, groups] (ints), f16 scales [out, groups]."""
    out, n = w.shape
    maxq = 2 ** bits - 1
    g = w.reshape(out, n // group, group)
    if sym:
        amax = np.abs(g).max(axis=2)
        scale = (2 * amax / maxq).astype(np.float16)
        zero = np.full(amax.shape, (maxq + 1) // 2, np.int64)
    else:
        lo, hi = np.minimum(g.min(axis=2), 0), np.maximum(g.max(axis=2), 0)
        scale = ((hi - lo) / maxq).astype(np.float16)
        zero = np.clip(np.round(-lo / scale.astype(np.float32)), 0, maxq).astype(np.int64)
    s = scale.astype(np.float32)[:, :, None]
    codes = np.clip(np.round(g / s) + zero[:, :, None], 0, maxq).astype(np.int64).reshape(out, n)
    return codes, zero, scale


def pack(values, bits, axis):
    """Packs ints along `axis`, 32 / bits to a word, the first in the lowest bits -> int32."""
    per = 32 // bits
    v = np.moveaxis(values.astype(np.uint64), axis, 0)
    words = np.zeros((v.shape[0] // per,) + v.shape[1:], np.uint64)
    for k in range(per):
        words |= (v[k::per] & (2 ** bits - 1)) << (bits * k)
    return np.moveaxis(words.astype(np.uint32), 0, axis).view(np.int32)


def pack_awq(values):
    """[rows, out] 4-bit ints -> [rows, out / 8] int32 in AWQ's interleaved nibble order."""
    rows, out = values.shape
    words = np.zeros((rows, out // 8), np.uint64)
    for k, offset in enumerate(AWQ_ORDER):
        words |= values[:, offset::8].astype(np.uint64) << (4 * k)
    return words.astype(np.uint32).view(np.int32)


def unpack(words, bits, axis):
    per = 32 // bits
    w = np.moveaxis(words.view(np.uint32).astype(np.uint64), axis, 0)
    out = np.zeros((w.shape[0] * per,) + w.shape[1:], np.int64)
    for k in range(per):
        out[k::per] = (w >> (bits * k)) & (2 ** bits - 1)
    return np.moveaxis(out, 0, axis)


def unpack_awq(words):
    w = words.view(np.uint32).astype(np.uint64)
    out = np.zeros((w.shape[0], w.shape[1] * 8), np.int64)
    for k, offset in enumerate(AWQ_ORDER):
        out[:, offset::8] = (w >> (4 * k)) & 15
    return out


def make_weights(src, dst, variant, group):
    method = variant[:4] if variant.startswith("gptq") else "awq"
    bits, sym, v2 = {"gptq4": (4, False, False), "gptq4sym": (4, True, False), "gptq8v2": (8, True, True),
                    "awq4": (4, False, False)}[variant]
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    out = {}
    for name, (dtype, arr) in read_safetensors(os.path.join(src, "model.safetensors")).items():
        assert dtype == "BF16", (name, dtype)
        w = bf16_to_f32(arr)
        if not quantized(name, w.shape[0], bits):
            out[name] = ("F16", w.astype(np.float16))
            continue
        module = name[: -len(".weight")]
        codes, zero, scale = quantize(w, bits, group, sym)
        out[module + ".scales"] = ("F16", np.ascontiguousarray(scale.T))
        if method == "gptq":
            stored = zero if v2 else zero - 1
            assert stored.min() >= 0, f"{name}: a zero point of 0 has no v1 form"
            out[module + ".qweight"] = ("I32", pack(codes.T, bits, 0))
            out[module + ".qzeros"] = ("I32", pack(stored.T, bits, 1))
            out[module + ".g_idx"] = ("I32", (np.arange(w.shape[1]) // group).astype(np.int32))
        else:
            out[module + ".qweight"] = ("I32", pack_awq(codes.T))
            out[module + ".qzeros"] = ("I32", pack_awq(zero.T))
    if method == "gptq":
        q = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": False, "sym": sym,
             "damp_percent": 0.01, "static_groups": False, "true_sequential": True,
             "checkpoint_format": "gptq_v2" if v2 else "gptq", "model_file_base_name": "model"}
    else:
        q = {"quant_method": "awq", "bits": bits, "group_size": group, "version": "gemm", "zero_point": True,
             "modules_to_not_convert": ["mlp.gate"]}
    cfg["quantization_config"] = q
    cfg["torch_dtype"] = "float16"
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    write_safetensors(os.path.join(dst, "model.safetensors"), out)
    with open(os.path.join(src, "reference.json")) as f:
        prompt = json.load(f)["prompt_ids"]
    ref = {"prompt_ids": prompt,
           "reference": "petrel CPU on the dequantized weights (f32) as a plain checkpoint: "
                        "tools/quant4_fixture.py reference"}
    with open(os.path.join(dst, "reference.json"), "w") as f:
        json.dump(ref, f)
    print(f"wrote {dst}: {len(out)} tensors, {variant}, group {group}")


def dequantized(dst):
    """The folder's tensors with every quantized module as an f32 `.weight`, and its config without
    quantization_config."""
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    q = cfg.pop("quantization_config")
    bits, group = q["bits"], q["group_size"]
    zero_offset = 1 if q["quant_method"] == "gptq" and q.get("checkpoint_format", "gptq") == "gptq" else 0
    tensors = read_safetensors(os.path.join(dst, "model.safetensors"))
    out = {}
    for name, (dtype, arr) in tensors.items():
        if not name.endswith(".qweight"):
            if not name.endswith((".qzeros", ".scales", ".g_idx")):
                out[name] = (dtype, arr)
            continue
        module = name[: -len(".qweight")]
        scale = tensors[module + ".scales"][1].astype(np.float32)       # [groups, out]
        if q["quant_method"] == "gptq":
            codes = unpack(arr, bits, 0)                                   # [in, out]
            zero = unpack(tensors[module + ".qzeros"][1], bits, 1) + zero_offset
            g = tensors[module + ".g_idx"][1]
        else:
            codes = unpack_awq(arr)
            zero = unpack_awq(tensors[module + ".qzeros"][1])
            g = np.arange(codes.shape[0]) // group
        w = scale[g] * (codes - zero[g]).astype(np.float32)                # [in, out]
        out[module + ".weight"] = ("F32", np.ascontiguousarray(w.T.astype(np.float32)))
    return cfg, out


def make_reference(dst, petrel):
    with open(os.path.join(dst, "reference.json")) as f:
        ids = ",".join(str(i) for i in json.load(f)["prompt_ids"])
    cfg, tensors = dequantized(dst)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        write_safetensors(os.path.join(tmp, "model.safetensors"), tensors)
        subprocess.run([petrel, "dump-logits", tmp, "--device", "cpu", "--prompt-ids", ids,
                        "--out", os.path.join(dst, "logits.npy")], check=True)
    print(f"wrote {dst}/logits.npy")


def main():
    args = sys.argv[1:]
    if len(args) == 5 and args[0] == "weights":
        if os.path.isdir(args[2]):
            shutil.rmtree(args[2])
        make_weights(args[1], args[2], args[3], int(args[4]))
    elif len(args) == 3 and args[0] == "reference":
        make_reference(args[1], args[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
