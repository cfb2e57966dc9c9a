#!/usr/bin/env python3
"""Builds the small random checkpoints in tests/fixtures/ and their Hugging Face reference outputs.

Runs where torch + transformers 5.x are installed (the GPU machine; CPU is enough):
    python3 tools/make_fixtures.py --out tests/fixtures/models

Each fixture folder gets config.json, safetensors weights in a real-world on-disk layout,
reference.json (prompt ids, HF greedy continuation made with HF's cache, versions) and
logits.npy (float32 [T, vocab], HF fp32 forward over the whole prompt).

Layouts covered: Qwen3.5-MoE VLM-wrapped with fused experts (+ mtp.* / model.visual.* tensors
that must be skipped), Qwen3.5-MoE text-only with per-expert tensors, dense Qwen3.5 (VLM-wrapped),
Qwen3-Next (grouped in_proj_qkvz / in_proj_ba, per-expert, sharded, no layer_types),
Qwen3-MoE (per-expert, one dense mlp_only layer), dense Qwen3 in fp32, two MLX conversions
made here with MLX's exact affine scheme (4-bit group 32 with 8-bit/64 router overrides;
8-bit group 64 for Qwen3-Next), and the bf16 forms llama.cpp's converter takes for its qwen3moe
and qwen3 architectures (Qwen3-MoE with every layer sparse, dense Qwen3).

    python3 tools/make_fixtures.py --out tests/fixtures/models --only qwen3moe-sparse,qwen3-dense

writes only the named fixtures and leaves the others (the MLX ones derive from fixtures 1 and 4
and come only from a whole run).
"""
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

PROMPT_LEN = 140
GEN_TOKENS = 24
VOCAB = 256

# Dimensions chosen so that no two are equal by accident (traps: Hv != Hk, dk != dv, Hq*D != H).
H = 64
HQ, HKV, HEAD_DIM = 4, 2, 32
HK, HV, DK, DV = 2, 4, 16, 24
N_EXPERTS, TOP_K, MOE_I, SHARED_I = 6, 2, 32, 48
DENSE_I = 96
LAYERS = 4


def hybrid_common():
    return dict(
        vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS,
        num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=HEAD_DIM,
        linear_num_key_heads=HK, linear_num_value_heads=HV,
        linear_key_head_dim=DK, linear_value_head_dim=DV, linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=4096,
        hidden_act="silu", attention_bias=False,
    )


def qwen35_rope():
    # 0.25 * 32 = 8 rotary dims -> 4 frequencies -> mrope sections summing to 4.
    return dict(rope_type="default", rope_theta=1.0e6, partial_rotary_factor=0.25,
                mrope_section=[2, 1, 1], mrope_interleaved=True)


def build_qwen35_moe():
    cfg = transformers.Qwen3_5MoeTextConfig(
        **hybrid_common(),
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_experts=N_EXPERTS, num_experts_per_tok=TOP_K,
        moe_intermediate_size=MOE_I, shared_expert_intermediate_size=SHARED_I,
        rope_parameters=qwen35_rope(),
    )
    return transformers.Qwen3_5MoeForCausalLM(cfg)


def build_qwen35_dense():
    cfg = transformers.Qwen3_5TextConfig(
        **hybrid_common(), intermediate_size=DENSE_I,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        rope_parameters=qwen35_rope(),
    )
    return transformers.Qwen3_5ForCausalLM(cfg)


def build_qwen3_next():
    cfg = transformers.Qwen3NextConfig(
        **hybrid_common(), intermediate_size=DENSE_I, full_attention_interval=2,
        num_experts=N_EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=True,
        moe_intermediate_size=MOE_I, shared_expert_intermediate_size=SHARED_I,
        decoder_sparse_step=1, mlp_only_layers=[],
        rope_parameters=dict(rope_type="default", rope_theta=1.0e7, partial_rotary_factor=0.25),
    )
    return transformers.Qwen3NextForCausalLM(cfg)


def build_qwen3_moe(dense_layers=(0,)):
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS,
        num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=HEAD_DIM,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=4096,
        intermediate_size=DENSE_I, moe_intermediate_size=MOE_I, num_experts=N_EXPERTS,
        num_experts_per_tok=TOP_K, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=list(dense_layers),
        rope_parameters=dict(rope_type="default", rope_theta=1.0e6),
    )
    return transformers.Qwen3MoeForCausalLM(cfg)


def build_qwen3_dense():
    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=H, num_hidden_layers=3,
        num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=HEAD_DIM,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=4096,
        intermediate_size=DENSE_I, rope_parameters=dict(rope_type="default", rope_theta=1.0e6),
    )
    return transformers.Qwen3ForCausalLM(cfg)


def randomize(model, zero_centred, gen):
    """Replaces HF's init with values that make every op matter (non-trivial norms, decays, routing)."""
    for name, p in model.named_parameters():
        shape = p.shape
        if name.endswith("linear_attn.norm.weight"):
            v = 1.0 + 0.2 * torch.randn(shape, generator=gen)
        elif "norm" in name and name.endswith("weight"):
            v = 0.2 * torch.randn(shape, generator=gen)
            if not zero_centred:
                v = v + 1.0
        elif name.endswith("A_log"):
            v = torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=gen))
        elif name.endswith("dt_bias"):
            v = torch.empty(shape).uniform_(-1.0, 1.0, generator=gen)
        elif "conv1d" in name:
            v = 0.5 * torch.randn(shape, generator=gen)
        elif "embed_tokens" in name:
            v = torch.randn(shape, generator=gen)
        elif name.endswith("mlp.gate.weight"):
            v = 3.0 * torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        else:
            v = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        with torch.no_grad():
            p.copy_(v)


def round_params(model, dtype):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))


def reference_outputs(model, prompt):
    model.eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        logits = model(ids).logits[0].float().numpy()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        out = model.generate(ids, max_new_tokens=GEN_TOKENS, do_sample=False, use_cache=True,
                             min_new_tokens=GEN_TOKENS)
    return logits, out[0, len(prompt):].tolist()


def split_experts(sd, E):
    """HF v5 holds experts fused in memory; write them one tensor per expert, as released files do."""
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            assert v.shape[0] == E and v.shape[1] == 2 * MOE_I, (k, v.shape)
            for e in range(E):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :MOE_I].contiguous()
                out[f"{base}{e}.up_proj.weight"] = v[e, MOE_I:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            assert v.shape[0] == E and v.shape[1] == H, (k, v.shape)
            for e in range(E):
                out[f"{base}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    return out


def fused_experts(sd):
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            assert tuple(v.shape) == (N_EXPERTS, 2 * MOE_I, H), (k, v.shape)
        if k.endswith("mlp.experts.down_proj"):
            assert tuple(v.shape) == (N_EXPERTS, H, MOE_I), (k, v.shape)
    return dict(sd)


def fuse_experts(sd):
    """Normalises to the fused in-memory layout whichever way this transformers version holds experts."""
    out, per = {}, {}
    for k, v in sd.items():
        parts = k.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            base = ".".join(parts[: i + 1]) + "."
            per.setdefault(base, {})[(int(parts[i + 1]), parts[i + 2])] = v
        else:
            out[k] = v
    for base, d in per.items():
        E = 1 + max(e for e, _ in d)
        out[base + "gate_up_proj"] = torch.stack(
            [torch.cat([d[(e, "gate_proj")], d[(e, "up_proj")]], 0) for e in range(E)])
        out[base + "down_proj"] = torch.stack([d[(e, "down_proj")] for e in range(E)])
    return out


def to_model_layout(model, sd):
    fused = any(k.endswith("experts.gate_up_proj") for k in model.state_dict())
    return sd if fused else split_experts(sd, N_EXPERTS)


def state_dict(model, dtype):
    return fuse_experts({k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()})


def write_fixture(path, config, tensors, logits, prompt, greedy, extra=None, shards=1):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    names = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k] for k in names}, os.path.join(path, "model.safetensors"),
                  metadata={"format": "pt"})
    else:
        per = (len(names) + shards - 1) // shards
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s * per:(s + 1) * per]
            save_file({k: tensors[k] for k in part}, os.path.join(path, fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in part})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    np.save(os.path.join(path, "logits.npy"), logits.astype(np.float32))
    ref = {"prompt_ids": prompt, "greedy_ids": greedy, "transformers": transformers.__version__,
           "torch": torch.__version__}
    ref.update(extra or {})
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(ref, f)
    print(f"wrote {path}: {len(tensors)} tensors, greedy {greedy[:8]}...")


def text_config_dict(model, drop=()):
    d = model.config.to_dict()
    for k in list(d):
        if k in drop or k.startswith("_") or k in ("transformers_version", "dtype", "torch_dtype"):
            d.pop(k, None)
    return d


def vlm_wrap(text_cfg, model_type, arch):
    """The Qwen3.5 release form: text fields under text_config plus a vision config."""
    text_cfg = dict(text_cfg)
    return {
        "architectures": [arch], "model_type": model_type, "text_config": text_cfg,
        "vision_config": {"depth": 1, "hidden_size": 16, "model_type": model_type.replace("_moe", "") + "_vision"},
        "tie_word_embeddings": False, "image_token_id": VOCAB - 4, "video_token_id": VOCAB - 3,
        "vision_start_token_id": VOCAB - 2, "vision_end_token_id": VOCAB - 1,
    }


# ----------------------------------------------------------------------------- MLX conversion

def mlx_quantize(w, bits, group):
    """MLX affine quantisation of a [..., out, in] float tensor, exactly as mlx's CPU kernel does."""
    w32 = w.float()
    shape = w32.shape
    g = w32.reshape(-1, group)
    n_bins = float((1 << bits) - 1)
    w_max = g.max(dim=1).values
    w_min = g.min(dim=1).values
    mask = w_min.abs() > w_max.abs()
    scale = torch.clamp((w_max - w_min) / n_bins, min=1e-7)
    scale = torch.where(mask, scale, -scale)
    edge = torch.where(mask, w_min, w_max)
    q0 = torch.round(edge / scale)
    nz = q0 != 0
    scale = torch.where(nz, edge / torch.where(nz, q0, torch.ones_like(q0)), scale)
    bias = torch.where(nz, edge, torch.zeros_like(edge))
    q = torch.clamp(torch.round((g - bias[:, None]) / scale[:, None]), 0, n_bins).to(torch.int64)
    per_word = 32 // bits
    q = q.reshape(-1, per_word)
    word = torch.zeros(q.shape[0], dtype=torch.int64)
    for p in range(per_word):
        word |= q[:, p] << (bits * p)   # lowest bits hold the first element
    packed = word.to(torch.uint32).reshape(*shape[:-1], shape[-1] // per_word)
    scales = scale.to(torch.bfloat16).reshape(*shape[:-1], shape[-1] // group)
    biases = bias.to(torch.bfloat16).reshape(*shape[:-1], shape[-1] // group)
    return packed, scales, biases


def mlx_dequantize(packed, scales, biases, bits, group):
    per_word = 32 // bits
    words = packed.to(torch.int64).reshape(-1)
    vals = torch.stack([(words >> (bits * p)) & ((1 << bits) - 1) for p in range(per_word)], dim=1)
    out_shape = (*packed.shape[:-1], packed.shape[-1] * per_word)
    q = vals.reshape(-1, group).float()
    w = q * scales.float().reshape(-1, 1) + biases.float().reshape(-1, 1)
    return w.reshape(out_shape)


SHIFTED_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
                 "k_norm.weight")


def is_shifted_norm(key):
    return key.endswith(SHIFTED_NORMS) or key in ("model.norm.weight",)


def mlx_convert(hf_sd, bits, group, router_bits, router_group, prefix_fn):
    """Returns (mlx tensors, quantization config entries, hf-layout float weights the MLX file encodes)."""
    mlx, quant, effective = {}, {}, {}
    # Stack experts into switch_mlp (gate/up split from the fused tensor when present).
    staged = {}
    for k, v in hf_sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("experts.gate_up_proj")]
            staged[base + "switch_mlp.gate_proj.weight"] = v[:, :MOE_I]
            staged[base + "switch_mlp.up_proj.weight"] = v[:, MOE_I:]
        elif k.endswith("mlp.experts.down_proj"):
            staged[k[: -len("experts.down_proj")] + "switch_mlp.down_proj.weight"] = v
        else:
            staged[k] = v
    for k, v in staged.items():
        module = k[: -len(".weight")] if k.endswith(".weight") else None
        if k.endswith("conv1d.weight"):
            mlx[prefix_fn(k)] = v.transpose(1, 2).contiguous()   # [C,1,K] -> [C,K,1]
            effective[k] = v.float()
            continue
        if is_shifted_norm(k):
            shifted = (v.float() + 1.0).to(torch.bfloat16)
            mlx[prefix_fn(k)] = shifted
            effective[k] = shifted.float() - 1.0
            continue
        is_router = k.endswith("mlp.gate.weight") or k.endswith("shared_expert_gate.weight")
        b, gsz = (router_bits, router_group) if is_router else (bits, group)
        quantizable = module is not None and v.dim() >= 2 and "norm" not in k and v.shape[-1] % gsz == 0
        if not quantizable:
            mlx[prefix_fn(k)] = v
            effective[k] = v.float()
            continue
        packed, scales, biases = mlx_quantize(v, b, gsz)
        pm = prefix_fn(module)
        mlx[pm + ".weight"], mlx[pm + ".scales"], mlx[pm + ".biases"] = packed, scales, biases
        if is_router:
            quant[pm] = {"group_size": gsz, "bits": b}
        effective[k] = mlx_dequantize(packed, scales, biases, b, gsz)
    return mlx, quant, effective


def load_effective(model, effective):
    """Loads MLX-decoded weights back into the HF model (fused expert tensors rebuilt)."""
    sd = dict(effective)
    for k in list(sd):
        if k.endswith("switch_mlp.gate_proj.weight"):
            base = k[: -len("switch_mlp.gate_proj.weight")]
            gate = sd.pop(k)
            up = sd.pop(base + "switch_mlp.up_proj.weight")
            sd[base + "experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
            sd[base + "experts.down_proj"] = sd.pop(base + "switch_mlp.down_proj.weight")
    model.load_state_dict(to_model_layout(model, sd), strict=True)


# ----------------------------------------------------------------------------- main

def make_prompt(gen):
    first = torch.randint(0, VOCAB, (PROMPT_LEN - 40,), generator=gen).tolist()
    return first + first[10:50]   # a repeated stretch, so prompt-lookup drafting has something to find


STANDALONE = ["qwen35moe-vlm-fused", "qwen35moe-text-per-expert", "qwen35-dense", "qwen3next-sharded", "qwen3moe",
              "qwen3-dense-f32", "qwen3moe-sparse", "qwen3-dense"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated fixtures to write, leaving the others: "
                    + ", ".join(STANDALONE))
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    if only - set(STANDALONE):
        sys.exit(f"--only: {', '.join(sorted(only - set(STANDALONE)))} not among {', '.join(STANDALONE)}")
    if not only and os.path.isdir(args.out):
        shutil.rmtree(args.out)

    def want(name):
        if only and name not in only:
            return False
        if os.path.isdir(os.path.join(args.out, name)):
            shutil.rmtree(os.path.join(args.out, name))
        return True

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    prompt = make_prompt(gen)

    def prepare(builder, zero_centred, dtype, seed):
        torch.manual_seed(seed)
        m = builder().float()
        randomize(m, zero_centred, torch.Generator().manual_seed(seed))
        round_params(m, dtype)
        m.config._attn_implementation = "eager"
        return m

    # 1. Qwen3.5-MoE, release layout: VLM-wrapped, fused experts, mtp.* and model.visual.* present.
    if want("qwen35moe-vlm-fused"):
        m = prepare(build_qwen35_moe, True, torch.bfloat16, 1)
        sd = state_dict(m, torch.bfloat16)
        print("qwen3_5_moe keys:", sorted(sd)[:60])
        logits, greedy = reference_outputs(m, prompt)
        tensors = {}
        for k, v in fused_experts(sd).items():
            tensors[("model.language_model." + k[len("model."):]) if k.startswith("model.") else k] = v
        tensors["mtp.fc.weight"] = torch.zeros(H, 2 * H, dtype=torch.bfloat16)
        tensors["mtp.norm.weight"] = torch.zeros(H, dtype=torch.bfloat16)
        tensors["model.visual.patch_embed.proj.weight"] = torch.zeros(16, 3, 2, 2, dtype=torch.bfloat16)
        text_cfg = text_config_dict(m)
        cfg = vlm_wrap(text_cfg, "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration")
        write_fixture(os.path.join(args.out, "qwen35moe-vlm-fused"), cfg, tensors, logits, prompt, greedy)
        qwen35moe_sd, qwen35moe_model, qwen35moe_cfg = sd, m, cfg

    # 2. Qwen3.5-MoE text-only with one tensor per expert.
    if want("qwen35moe-text-per-expert"):
        m = prepare(build_qwen35_moe, True, torch.bfloat16, 2)
        sd = state_dict(m, torch.bfloat16)
        logits, greedy = reference_outputs(m, prompt)
        cfg = text_config_dict(m)
        cfg["architectures"] = ["Qwen3_5MoeForCausalLM"]
        write_fixture(os.path.join(args.out, "qwen35moe-text-per-expert"), cfg, split_experts(sd, N_EXPERTS),
                      logits, prompt, greedy)

    # 3. Dense Qwen3.5 (hybrid GDN + attention, dense MLP), VLM-wrapped.
    if want("qwen35-dense"):
        m = prepare(build_qwen35_dense, True, torch.bfloat16, 3)
        sd = state_dict(m, torch.bfloat16)
        print("qwen3_5 keys:", sorted(sd)[:40])
        logits, greedy = reference_outputs(m, prompt)
        tensors = {("model.language_model." + k[len("model."):]) if k.startswith("model.") else k: v
                   for k, v in sd.items()}
        cfg = vlm_wrap(text_config_dict(m), "qwen3_5", "Qwen3_5ForConditionalGeneration")
        write_fixture(os.path.join(args.out, "qwen35-dense"), cfg, tensors, logits, prompt, greedy)

    # 4. Qwen3-Next: grouped qkvz/ba, per-expert tensors, no layer_types, two shards.
    if want("qwen3next-sharded"):
        m = prepare(build_qwen3_next, True, torch.bfloat16, 4)
        sd = state_dict(m, torch.bfloat16)
        print("qwen3_next keys:", sorted(sd)[:60])
        logits, greedy = reference_outputs(m, prompt)
        cfg = text_config_dict(m, drop=("layer_types",))
        cfg["architectures"] = ["Qwen3NextForCausalLM"]
        cfg["full_attention_interval"] = 2   # the released config carries the interval, not layer_types
        write_fixture(os.path.join(args.out, "qwen3next-sharded"), cfg, split_experts(sd, N_EXPERTS),
                      logits, prompt, greedy, shards=2)
        qwen3next_sd, qwen3next_model, qwen3next_cfg = sd, m, cfg

    def plain_fixture(name, builder, dtype, seed, arch, per_expert):
        """A text-only Qwen3-family fixture (plain norms): its weights as `dtype`, experts split."""
        m = prepare(builder, False, dtype, seed)
        sd = state_dict(m, dtype)
        logits, greedy = reference_outputs(m, prompt)
        cfg = text_config_dict(m)
        cfg["architectures"] = [arch]
        write_fixture(os.path.join(args.out, name), cfg, split_experts(sd, N_EXPERTS) if per_expert else sd, logits,
                      prompt, greedy)

    # 5. Qwen3-MoE: plain norms, no output gate, full rotary, no shared expert, layer 0 dense.
    if want("qwen3moe"):
        plain_fixture("qwen3moe", build_qwen3_moe, torch.bfloat16, 5, "Qwen3MoeForCausalLM", True)
    # 6. Dense Qwen3 stored in fp32.
    if want("qwen3-dense-f32"):
        plain_fixture("qwen3-dense-f32", build_qwen3_dense, torch.float32, 6, "Qwen3ForCausalLM", False)
    # 7. Qwen3-MoE with every layer sparse: the form llama.cpp's qwen3moe architecture holds.
    if want("qwen3moe-sparse"):
        plain_fixture("qwen3moe-sparse", lambda: build_qwen3_moe(dense_layers=()), torch.bfloat16, 9,
                      "Qwen3MoeForCausalLM", True)
    # 8. Dense Qwen3 in bf16, the converter's lossless input for its qwen3 architecture.
    if want("qwen3-dense"):
        plain_fixture("qwen3-dense", build_qwen3_dense, torch.bfloat16, 10, "Qwen3ForCausalLM", False)

    if only:
        return
    # 9. MLX 4-bit (group 32, router and shared gate 8-bit/64) of fixture 1, mlx-lm VLM key layout.
    def qwen35_mlx_name(k):
        if k.startswith("model."):
            return "language_model.model." + k[len("model."):]
        return "language_model." + k
    mlx, quant, effective = mlx_convert(qwen35moe_sd, 4, 32, 8, 64, qwen35_mlx_name)
    m = prepare(build_qwen35_moe, True, torch.bfloat16, 1)
    load_effective(m, effective)
    logits, greedy = reference_outputs(m, prompt)
    cfg = json.loads(json.dumps(qwen35moe_cfg))
    q = {"group_size": 32, "bits": 4, "mode": "affine"}
    q.update(quant)
    cfg["quantization"] = q
    cfg["quantization_config"] = q
    write_fixture(os.path.join(args.out, "mlx-qwen35moe-4bit"), cfg, mlx, logits, prompt, greedy)

    # 10. MLX 8-bit group 64 of fixture 4 (grouped qkvz kept; expert down_proj stays bf16: 32 % 64 != 0).
    mlx, quant, effective = mlx_convert(qwen3next_sd, 8, 64, 8, 64, lambda k: k)
    m = prepare(build_qwen3_next, True, torch.bfloat16, 4)
    load_effective(m, effective)
    logits, greedy = reference_outputs(m, prompt)
    cfg = json.loads(json.dumps(qwen3next_cfg))
    q = {"group_size": 64, "bits": 8}
    q.update(quant)
    cfg["quantization"] = q
    cfg["quantization_config"] = q
    write_fixture(os.path.join(args.out, "mlx-qwen3next-8bit"), cfg, mlx, logits, prompt, greedy)


if __name__ == "__main__":
    main()
