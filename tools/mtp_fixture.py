#!/usr/bin/env python3
"""Fixtures for the multi-token prediction (MTP) head, with numpy only (no torch).

    python3 tools/mtp_fixture.py weights SRC DST
        Copies the fixture SRC to DST and adds a complete random MTP head (mtp.*, seeded) in the
        layout of SRC's trunk: fused experts for Qwen3.5 (whose config gains
        mtp_num_hidden_layers: 1), one tensor per expert in an extra shard for Qwen3-Next (whose
        configs have no MTP key). The trunk is untouched, so SRC's Hugging Face references still hold.

    python3 tools/mtp_fixture.py reference DST HIDDEN.npy
        HIDDEN.npy is the trunk's residual stream before the final norm over DST's reference prompt
        (petrel dump-logits --hidden-out). Checks that the final norm and LM head of it give DST's
        Hugging Face logits, then computes the MTP head independently of Petrel (model-spec section 5)
        and writes DST/mtp_logits.npy (row t: from h_t and prompt token t+1) and
        DST/mtp_chain.json (three chained draft steps after the last row: tokens and logits).
"""
import glob
import json
import os
import shutil
import struct
import sys

import numpy as np

SEED = 70
CHAIN_STEPS = 3


# ---------------------------------------------------------------------------------------- safetensors

def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif t["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype=np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name}: dtype {t['dtype']} not handled")
        out[name] = (arr.reshape(t["shape"]).astype(np.float64), t["dtype"])
    return out


def to_bf16_bits(x):
    """float -> bf16 bit patterns, round to nearest even."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def write_safetensors(path, tensors):
    """tensors: name -> float array, stored as bf16."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        raw = to_bf16_bits(tensors[name]).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_all(folder):
    tensors = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        for name, (arr, _) in read_safetensors(path).items():
            tensors[name] = arr
    return tensors


def text_config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    return cfg, cfg.get("text_config", cfg)


# ---------------------------------------------------------------------------------------- weights

def mtp_tensors(c, per_expert, rng):
    H, Hq, Hkv, D = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I, S = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]

    def mat(rows, cols, *lead):
        return rng.normal(0.0, 1.0 / np.sqrt(cols), size=(*lead, rows, cols))

    def norm(n):  # zero-centred: the multiplier is 1 + w
        return rng.normal(0.0, 0.1, size=(n,))

    t = {
        "mtp.fc.weight": mat(H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": norm(H),
        "mtp.pre_fc_norm_hidden.weight": norm(H),
        "mtp.norm.weight": norm(H),
    }
    p = "mtp.layers.0."
    t[p + "input_layernorm.weight"] = norm(H)
    t[p + "post_attention_layernorm.weight"] = norm(H)
    t[p + "self_attn.q_proj.weight"] = mat(2 * Hq * D, H)
    t[p + "self_attn.k_proj.weight"] = mat(Hkv * D, H)
    t[p + "self_attn.v_proj.weight"] = mat(Hkv * D, H)
    t[p + "self_attn.o_proj.weight"] = mat(H, Hq * D)
    t[p + "self_attn.q_norm.weight"] = norm(D)
    t[p + "self_attn.k_norm.weight"] = norm(D)
    t[p + "mlp.gate.weight"] = mat(E, H)
    if per_expert:
        for e in range(E):
            t[p + f"mlp.experts.{e}.gate_proj.weight"] = mat(I, H)
            t[p + f"mlp.experts.{e}.up_proj.weight"] = mat(I, H)
            t[p + f"mlp.experts.{e}.down_proj.weight"] = mat(H, I)
    else:
        t[p + "mlp.experts.gate_up_proj"] = mat(2 * I, H, E)
        t[p + "mlp.experts.down_proj"] = mat(H, I, E)
    t[p + "mlp.shared_expert.gate_proj.weight"] = mat(S, H)
    t[p + "mlp.shared_expert.up_proj.weight"] = mat(S, H)
    t[p + "mlp.shared_expert.down_proj.weight"] = mat(H, S)
    t[p + "mlp.shared_expert_gate.weight"] = mat(1, H)
    return t


def make_weights(src, dst):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    cfg, c = text_config(dst)
    next_arch = cfg["model_type"] == "qwen3_next"
    new = mtp_tensors(c, per_expert=next_arch, rng=np.random.default_rng(SEED))
    index_path = os.path.join(dst, "model.safetensors.index.json")
    if os.path.exists(index_path):
        # A shard of its own, listed in the index like every other.
        shard = "model-mtp.safetensors"
        write_safetensors(os.path.join(dst, shard), new)
        with open(index_path) as f:
            index = json.load(f)
        for name in new:
            index["weight_map"][name] = shard
        with open(index_path, "w") as f:
            json.dump(index, f, indent=2)
    else:
        path = os.path.join(dst, "model.safetensors")
        old = read_safetensors(path)
        dtypes = {d for _, d in old.values()}
        assert dtypes == {"BF16"}, f"{path}: expected a bf16 checkpoint, found {dtypes}"
        tensors = {n: a for n, (a, _) in old.items() if not n.startswith("mtp.")}
        tensors.update(new)
        write_safetensors(path, tensors)
    if not next_arch:
        c["mtp_num_hidden_layers"] = 1
        with open(os.path.join(dst, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
    print(f"{dst}: {len(new)} mtp tensors")


# ---------------------------------------------------------------------------------------- reference

def rms0(x, w, eps):
    """Zero-centred RMSNorm (multiplier 1 + w) over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class MtpHead:
    """The MTP head of model-spec section 5 with its own KV cache, one row at a time."""

    def __init__(self, w, c):
        self.w, self.c = w, c
        self.eps = c.get("rms_norm_eps", 1e-6)
        rope = c.get("rope_parameters", {})
        self.theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
        self.rot = int(c["head_dim"] * rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
        self.keys, self.values = [], []
        prefix = "model.language_model." if "model.language_model.embed_tokens.weight" in w else "model."
        self.embed = w[prefix + "embed_tokens.weight"]
        self.final_norm = w[prefix + "norm.weight"]
        self.lm_head = w["lm_head.weight"]

    def rope(self, x, pos):  # x: [heads, D], NeoX pairing on the first rot dims
        half = self.rot // 2
        inv = self.theta ** (-np.arange(half) * 2.0 / self.rot)
        ang = pos * inv
        cos, sin = np.cos(ang), np.sin(ang)
        y = x.copy()
        a, b = x[:, :half], x[:, half:self.rot]
        y[:, :half] = a * cos - b * sin
        y[:, half:self.rot] = b * cos + a * sin
        return y

    def attention(self, x, pos):
        c, w, p = self.c, self.w, "mtp.layers.0.self_attn."
        Hq, Hkv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        qg = (w[p + "q_proj.weight"] @ x).reshape(Hq, 2 * D)
        q, gate = qg[:, :D], qg[:, D:].reshape(-1)
        q = self.rope(rms0(q, w[p + "q_norm.weight"], self.eps), pos)
        k = self.rope(rms0((w[p + "k_proj.weight"] @ x).reshape(Hkv, D), w[p + "k_norm.weight"], self.eps), pos)
        v = (w[p + "v_proj.weight"] @ x).reshape(Hkv, D)
        self.keys.append(k)
        self.values.append(v)
        K, V = np.stack(self.keys), np.stack(self.values)  # [n, Hkv, D]
        out = np.zeros((Hq, D))
        for h in range(Hq):
            g = h // (Hq // Hkv)
            s = K[:, g, :] @ q[h] / np.sqrt(D)
            s = np.exp(s - s.max())
            out[h] = (s / s.sum()) @ V[:, g, :]
        return w[p + "o_proj.weight"] @ (out.reshape(-1) * sigmoid(gate))

    def expert(self, e, x):
        w, p, I = self.w, "mtp.layers.0.mlp.experts.", self.c["moe_intermediate_size"]
        if p + "gate_up_proj" in w:
            gu = w[p + "gate_up_proj"][e]
            g, u, d = gu[:I], gu[I:], w[p + "down_proj"][e]
        else:
            g, u, d = (w[p + f"{e}.{n}_proj.weight"] for n in ("gate", "up", "down"))
        return d @ (silu(g @ x) * (u @ x))

    def moe(self, x):
        w, c, p = self.w, self.c, "mtp.layers.0.mlp."
        logits = w[p + "gate.weight"] @ x
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        top = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[: c["num_experts_per_tok"]]
        weights = probs[top]
        if c.get("norm_topk_prob", True) or c.get("model_type", "").startswith("qwen3_5"):
            weights = weights / weights.sum()
        out = sum(wt * self.expert(e, x) for e, wt in zip(top, weights))
        shared = w[p + "shared_expert.down_proj.weight"] @ (
            silu(w[p + "shared_expert.gate_proj.weight"] @ x) * (w[p + "shared_expert.up_proj.weight"] @ x))
        return out + sigmoid(w[p + "shared_expert_gate.weight"] @ x)[0] * shared

    def step(self, hidden_normed, token, pos):
        """One row: h_t after the trunk's final norm (or the head's own output), the token after it.
        Returns (logits, the head's output after mtp.norm)."""
        w, eps, p = self.w, self.eps, "mtp.layers.0."
        e = rms0(self.embed[token], w["mtp.pre_fc_norm_embedding.weight"], eps)
        hh = rms0(hidden_normed, w["mtp.pre_fc_norm_hidden.weight"], eps)
        h = w["mtp.fc.weight"] @ np.concatenate([e, hh])
        h = h + self.attention(rms0(h, w[p + "input_layernorm.weight"], eps), pos)
        h = h + self.moe(rms0(h, w[p + "post_attention_layernorm.weight"], eps))
        d = rms0(h, w["mtp.norm.weight"], eps)
        return self.lm_head @ d, d


def make_reference(dst, hidden_path):
    _, c = text_config(dst)
    w = load_all(dst)
    with open(os.path.join(dst, "reference.json")) as f:
        ids = json.load(f)["prompt_ids"]
    hidden = np.load(hidden_path).astype(np.float64)
    assert hidden.shape == (len(ids), c["hidden_size"]), f"{hidden_path}: shape {hidden.shape}"
    head = MtpHead(w, c)
    normed = rms0(hidden, head.final_norm, head.eps)
    hf = np.load(os.path.join(dst, "logits.npy")).astype(np.float64)
    err = np.abs(normed @ head.lm_head.T - hf).max()
    print(f"trunk hidden vs the Hugging Face logits: max abs diff {err:.2e}")
    assert err < 1e-3, "the hidden states do not reproduce the reference logits"

    rows, out = [], None
    for t in range(len(ids) - 1):
        logits, out = head.step(normed[t], ids[t + 1], t)
        rows.append(logits)
    np.save(os.path.join(dst, "mtp_logits.npy"), np.array(rows, dtype=np.float32))
    chain = {"tokens": [], "logits": []}
    token = int(np.argmax(rows[-1]))
    for s in range(CHAIN_STEPS):
        logits, out = head.step(out, token, len(ids) - 1 + s)
        chain["tokens"].append(token)
        chain["logits"].append([float(v) for v in logits.astype(np.float32)])
        token = int(np.argmax(logits))
    with open(os.path.join(dst, "mtp_chain.json"), "w") as f:
        json.dump(chain, f)
    print(f"{dst}: mtp_logits.npy [{len(rows)}, {len(rows[0])}], mtp_chain.json ({CHAIN_STEPS} steps)")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "weights":
        make_weights(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "reference":
        make_reference(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
