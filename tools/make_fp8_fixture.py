#!/usr/bin/env python3
"""The fine-grained FP8 fixture quantized with torch, and its reference made with transformers.

Runs where torch + transformers 5.x are installed (the GPU machine; CPU is enough):
    python3 tools/make_fp8_fixture.py --src tests/fixtures/models/qwen35moe-vlm-fused \\
        --out tests/fixtures/models/qwen35moe-vlm-fp8

Quantizes SRC's linear weights to float8_e4m3fn with one fp32 inverse scale per 128 x 128 block,
with the arithmetic of transformers' fine-grained FP8 quantizer (Fp8Quantize: block max -> scale
= 448 / max (1 for an all-zero block), clamp to +-448, torch's cast, weight_scale_inv = 1 / scale).
That quantizer refuses dims that are not multiples of the block; transformers' FP8Linear reads
scale grids of ceil(out / 128) x ceil(in / 128), so edge blocks here are partial: the zero padding
of a block never raises its max. Tensor names, which modules stay bf16 and the expert layout come
from tools/fp8_fixture.py (the numpy maker of the same file).

Before writing, each tensor is compared bit for bit with the OUT/model.safetensors already there
(the numpy-made one), and the file bytes too; a difference is printed and makes the exit status 1.
Then the dequantized weights (code x scale in fp32) are loaded into Qwen3_5MoeForCausalLM in fp32
(eager attention) and OUT/logits.npy and OUT/reference.json (with the greedy continuation) are
written from it: the same reference the other fixtures have. Finally transformers is asked to load
OUT itself with FineGrainedFP8Config(dequantize=True); its result is printed, not required.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp8_fixture  # noqa: E402
import make_fixtures  # noqa: E402

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
FP8_MIN = torch.finfo(FP8).min
BLOCK = (128, 128)


def quantize(w):
    R, C = BLOCK
    rows, cols = w.shape
    gr, gc = -(-rows // R), -(-cols // C)
    padded = torch.zeros(gr * R, gc * C, dtype=torch.float32)
    padded[:rows, :cols] = w.float()
    tiles = padded.reshape(gr, R, gc, C)
    amax = tiles.abs().amax(dim=(1, 3))
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    scale = torch.where(amax > 0, FP8_MAX / safe, torch.ones_like(safe))
    q = torch.clamp(tiles * scale[:, None, :, None], min=FP8_MIN, max=FP8_MAX).to(FP8)
    return q.reshape(gr * R, gc * C)[:rows, :cols].contiguous(), (1.0 / scale).to(torch.float32)


def dequantize(q, inv):
    R, C = BLOCK
    rows, cols = q.shape
    s = inv.repeat_interleave(R, 0).repeat_interleave(C, 1)[:rows, :cols]
    return q.float() * s


def to_torch(dtype, arr):
    if dtype == "BF16":
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())


def quantized_tensors(src, cfg):
    tensors = fp8_fixture.split_experts(fp8_fixture.read_safetensors(os.path.join(src, "model.safetensors")),
                                        cfg["text_config"]["moe_intermediate_size"])
    skip = fp8_fixture.not_converted(cfg)
    out = {}
    for name, (dtype, arr) in tensors.items():
        t = to_torch(dtype, arr).contiguous()
        if fp8_fixture.converted(name, skip):
            out[name], out[name + "_scale_inv"] = quantize(t)
        else:
            out[name] = t
    return out, skip


def compare_with_existing(path, tensors):
    """Bit-for-bit comparison with the file already at `path`; returns the number of differences."""
    if not os.path.exists(path):
        print(f"{path}: none there to compare with")
        return 0
    old = load_file(path)
    bad = sorted(set(old) ^ set(tensors))
    for k in sorted(set(old) & set(tensors)):
        a, b = old[k], tensors[k]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
            bad.append(k)
    print(f"{path}: {len(bad)} tensors differ from the torch quantization" + (f": {bad[:10]}" if bad else ""))
    return len(bad)


def reference(cfg_text, tensors, prompt):
    """transformers' fp32 logits and greedy continuation of the dequantized weights."""
    sd = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv") or name.startswith(("model.visual.", "mtp.")):
            continue
        w = dequantize(t, tensors[name + "_scale_inv"]) if t.dtype == FP8 else t.float()
        sd[name.replace("model.language_model.", "model.", 1)] = w
    model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig.from_dict(cfg_text)).float()
    model.load_state_dict(make_fixtures.to_model_layout(model, make_fixtures.fuse_experts(sd)), strict=True)
    model.config._attn_implementation = "eager"
    return make_fixtures.reference_outputs(model, prompt)


def try_transformers_load(out):
    try:
        m = transformers.Qwen3_5MoeForConditionalGeneration.from_pretrained(
            out, quantization_config=transformers.FineGrainedFP8Config(dequantize=True))
        print(f"transformers loads {out} with FineGrainedFP8Config(dequantize=True): {type(m).__name__}")
    except Exception as e:  # reported, not required: transformers' own loader may refuse partial blocks
        print(f"transformers could not load {out} itself: {type(e).__name__}: {e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(os.path.join(args.src, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(args.src, "reference.json")) as f:
        prompt = json.load(f)["prompt_ids"]
    tensors, skip = quantized_tensors(args.src, cfg)
    path = os.path.join(args.out, "model.safetensors")
    old_bytes = open(path, "rb").read() if os.path.exists(path) else None
    differing = compare_with_existing(path, tensors)

    logits, greedy = reference(cfg["text_config"], tensors, prompt)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(BLOCK), "modules_to_not_convert": skip}
    extra = {"reference": "transformers fp32 forward of the dequantized weights (Qwen3_5MoeForCausalLM, eager); "
                          "tensors quantized by tools/make_fp8_fixture.py with torch"}
    make_fixtures.write_fixture(args.out, cfg, tensors, logits, prompt, greedy, extra=extra)
    if old_bytes is not None:
        same = open(path, "rb").read() == old_bytes
        print(f"{path}: file bytes {'identical to' if same else 'differ from'} the numpy-made file")
    try_transformers_load(args.out)
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
