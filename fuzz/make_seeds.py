#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/ (standard library only).

Checkpoint seeds are tiny valid checkpoints of every layout the loader maps (dense Qwen3 in bf16,
a VLM-wrapped hybrid Qwen3.5-MoE with fused experts, Qwen3-Next with grouped qkvz, MLX 4/8-bit,
a sharded Qwen3-MoE), in the format checkpoint_load_fuzz.cpp reads: files joined by a separator.
GGUF seeds are tiny qwen3 / qwen3moe GGUF files as llama.cpp's converter lays them out (BF16 or
Q8_0 matrices, F32 norms) and a file with a key of every value type.
Request and tool-call seeds are requests and model answers as the server sees them.
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
SEPARATOR = b"\n--petrel-fuzz-file--\n"  # checkpoint_load_fuzz.cpp's kSeparator


class Rng:
    """A fixed linear congruential generator: the seeds are the same on every run."""

    def __init__(self):
        self.state = 12345

    def uniform(self):
        self.state = (self.state * 1103515245 + 12345) % 2**31
        return self.state / 2**31 - 0.5


RNG = Rng()


def tensor(shape, dtype="BF16", fill=None):
    count = 1
    for d in shape:
        count *= d
    if dtype == "U32":
        data = b"".join(struct.pack("<I", int((RNG.uniform() + 0.5) * 2**32) % 2**32) for _ in range(count))
    else:
        values = [fill if fill is not None else RNG.uniform() * 0.2 for _ in range(count)]
        f32 = b"".join(struct.pack("<f", v) for v in values)
        data = f32 if dtype == "F32" else b"".join(f32[i + 2:i + 4] for i in range(0, len(f32), 4))
    return {"dtype": dtype, "shape": list(shape), "data": data}


def safetensors(tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        t = tensors[name]
        header[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [offset, offset + len(t["data"])]}
        blobs.append(t["data"])
        offset += len(t["data"])
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the official writer pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def config(**fields):
    return json.dumps(fields, indent=1).encode()


def attention(p, hidden, heads, kv_heads, head_dim, gate, norm_fill, dtype="BF16"):
    q_rows = (2 if gate else 1) * heads * head_dim
    return {
        p + "self_attn.q_proj.weight": tensor([q_rows, hidden], dtype),
        p + "self_attn.k_proj.weight": tensor([kv_heads * head_dim, hidden], dtype),
        p + "self_attn.v_proj.weight": tensor([kv_heads * head_dim, hidden], dtype),
        p + "self_attn.o_proj.weight": tensor([hidden, heads * head_dim], dtype),
        p + "self_attn.q_norm.weight": tensor([head_dim], dtype, norm_fill),
        p + "self_attn.k_norm.weight": tensor([head_dim], dtype, norm_fill),
    }


def mlp(p, hidden, inter, dtype="BF16"):
    return {
        p + "gate_proj.weight": tensor([inter, hidden], dtype),
        p + "up_proj.weight": tensor([inter, hidden], dtype),
        p + "down_proj.weight": tensor([hidden, inter], dtype),
    }


def norms(p, hidden, fill, dtype="BF16"):
    return {
        p + "input_layernorm.weight": tensor([hidden], dtype, fill),
        p + "post_attention_layernorm.weight": tensor([hidden], dtype, fill),
    }


def qwen3_dense():
    cfg = config(model_type="qwen3", vocab_size=8, hidden_size=4, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=2, intermediate_size=4, rms_norm_eps=1e-6,
                 rope_theta=1000000.0, tie_word_embeddings=True, max_position_embeddings=64, eos_token_id=2)
    t = {"model.embed_tokens.weight": tensor([8, 4]), "model.norm.weight": tensor([4], fill=1.0)}
    t.update(norms("model.layers.0.", 4, 1.0))
    t.update(attention("model.layers.0.", 4, 2, 1, 2, gate=False, norm_fill=1.0))
    t.update(mlp("model.layers.0.mlp.", 4, 4))
    return [cfg, safetensors(t, {"format": "pt"})]


def deltanet(p, hidden, k_heads, v_heads, k_dim, v_dim, kernel, mlx=False):
    channels = 2 * k_heads * k_dim + v_heads * v_dim
    return {
        p + "linear_attn.in_proj_qkv.weight": tensor([channels, hidden]),
        p + "linear_attn.in_proj_z.weight": tensor([v_heads * v_dim, hidden]),
        p + "linear_attn.in_proj_b.weight": tensor([v_heads, hidden]),
        p + "linear_attn.in_proj_a.weight": tensor([v_heads, hidden]),
        p + "linear_attn.out_proj.weight": tensor([hidden, v_heads * v_dim]),
        p + "linear_attn.conv1d.weight": tensor([channels, kernel, 1] if mlx else [channels, 1, kernel]),
        p + "linear_attn.A_log": tensor([v_heads]),
        p + "linear_attn.dt_bias": tensor([v_heads]),
        p + "linear_attn.norm.weight": tensor([v_dim], fill=1.0),
    }


def qwen35_moe_vlm():
    text = dict(model_type="qwen3_5_moe_text", vocab_size=8, hidden_size=4, num_hidden_layers=2,
                layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
                head_dim=2, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=2,
                linear_value_head_dim=2, linear_conv_kernel_dim=2, num_experts=2, num_experts_per_tok=1,
                moe_intermediate_size=2, shared_expert_intermediate_size=2, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0})
    cfg = config(model_type="qwen3_5_moe", text_config=text, tie_word_embeddings=False, eos_token_id=[2, 0])
    pre = "model.language_model."
    t = {pre + "embed_tokens.weight": tensor([8, 4]), pre + "norm.weight": tensor([4], fill=0.0),
         "lm_head.weight": tensor([8, 4]), "mtp.fc.weight": tensor([4, 4]),
         "model.visual.patch_embed.weight": tensor([2, 2])}
    for i in range(2):
        p = pre + "layers.%d." % i
        t.update(norms(p, 4, 0.0))
        if i == 0:
            t.update(deltanet(p, 4, 1, 2, 2, 2, 2))
        else:
            t.update(attention(p, 4, 2, 1, 2, gate=True, norm_fill=0.0))
        t[p + "mlp.gate.weight"] = tensor([2, 4])
        t[p + "mlp.experts.gate_up_proj"] = tensor([2, 4, 4])
        t[p + "mlp.experts.down_proj"] = tensor([2, 4, 2])
        t.update(mlp(p + "mlp.shared_expert.", 4, 2))
        t[p + "mlp.shared_expert_gate.weight"] = tensor([1, 4])
    return [cfg, safetensors(t)]


def qwen3_next():
    cfg = config(model_type="qwen3_next", vocab_size=8, hidden_size=4, num_hidden_layers=2, full_attention_interval=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=2, partial_rotary_factor=1.0,
                 linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=2, linear_value_head_dim=2,
                 linear_conv_kernel_dim=2, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=2,
                 shared_expert_intermediate_size=2, decoder_sparse_step=1, norm_topk_prob=True,
                 mlp_only_layers=[], tie_word_embeddings=True)
    t = {"model.embed_tokens.weight": tensor([8, 4]), "model.norm.weight": tensor([4], fill=0.0)}
    for i in range(2):
        p = "model.layers.%d." % i
        t.update(norms(p, 4, 0.0))
        if i == 0:
            t[p + "linear_attn.in_proj_qkvz.weight"] = tensor([1 * (2 * 2 + 2 * 2 * 2), 4])
            t[p + "linear_attn.in_proj_ba.weight"] = tensor([4, 4])
            t[p + "linear_attn.out_proj.weight"] = tensor([4, 4])
            t[p + "linear_attn.conv1d.weight"] = tensor([8, 1, 2])
            t[p + "linear_attn.A_log"] = tensor([2])
            t[p + "linear_attn.dt_bias"] = tensor([2])
            t[p + "linear_attn.norm.weight"] = tensor([2], fill=1.0)
        else:
            t.update(attention(p, 4, 2, 1, 2, gate=True, norm_fill=0.0))
        t[p + "mlp.gate.weight"] = tensor([2, 4])
        for e in range(2):
            t.update(mlp(p + "mlp.experts.%d." % e, 4, 2))
        t.update(mlp(p + "mlp.shared_expert.", 4, 2))
        t[p + "mlp.shared_expert_gate.weight"] = tensor([1, 4])
    return [cfg, safetensors(t)]


def quantized(t, name, rows, cols, bits, group):
    t[name + ".weight"] = tensor([rows, cols * bits // 32], "U32")
    t[name + ".scales"] = tensor([rows, cols // group])
    t[name + ".biases"] = tensor([rows, cols // group])


def mlx_qwen3():
    cfg = config(model_type="qwen3", vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=4, intermediate_size=8, tie_word_embeddings=True,
                 quantization={"group_size": 8, "bits": 4,
                               "model.layers.0.mlp.down_proj": {"group_size": 8, "bits": 8}})
    t = {"model.norm.weight": tensor([8], fill=1.0)}
    quantized(t, "model.embed_tokens", 8, 8, 4, 8)
    p = "model.layers.0."
    t.update(norms(p, 8, 1.0))
    for name, rows, cols in [("q_proj", 8, 8), ("k_proj", 4, 8), ("v_proj", 4, 8), ("o_proj", 8, 8)]:
        quantized(t, p + "self_attn." + name, rows, cols, 4, 8)
    t[p + "self_attn.q_norm.weight"] = tensor([4], fill=1.0)
    t[p + "self_attn.k_norm.weight"] = tensor([4], fill=1.0)
    quantized(t, p + "mlp.gate_proj", 8, 8, 4, 8)
    quantized(t, p + "mlp.up_proj", 8, 8, 4, 8)
    quantized(t, p + "mlp.down_proj", 8, 8, 8, 8)
    return [cfg, safetensors(t)]


def mlx_qwen35_dense():
    cfg = config(model_type="qwen3_5", vocab_size=8, hidden_size=8, num_hidden_layers=1,
                 layer_types=["linear_attention"], num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                 partial_rotary_factor=0.5, linear_num_key_heads=1, linear_num_value_heads=1,
                 linear_key_head_dim=4, linear_value_head_dim=8, linear_conv_kernel_dim=2, intermediate_size=8,
                 tie_word_embeddings=False, quantization={"group_size": 8, "bits": 8})
    t = {"model.norm.weight": tensor([8], fill=1.0)}
    quantized(t, "language_model.model.embed_tokens", 8, 8, 8, 8)
    quantized(t, "language_model.lm_head", 8, 8, 8, 8)
    p = "language_model.model.layers.0."
    t.update({k.replace("model.layers.0.", p): v for k, v in norms("model.layers.0.", 8, 1.0).items()})
    for name, rows, cols in [("in_proj_qkv", 16, 8), ("in_proj_z", 8, 8), ("in_proj_b", 1, 8), ("in_proj_a", 1, 8),
                             ("out_proj", 8, 8)]:
        quantized(t, p + "linear_attn." + name, rows, cols, 8, 8)
    t[p + "linear_attn.conv1d.weight"] = tensor([16, 2, 1])
    t[p + "linear_attn.A_log"] = tensor([1])
    t[p + "linear_attn.dt_bias"] = tensor([1])
    t[p + "linear_attn.norm.weight"] = tensor([8], fill=1.0)
    for name in ["gate_proj", "up_proj", "down_proj"]:
        quantized(t, p + "mlp." + name, 8, 8, 8, 8)
    return [cfg, safetensors(t)]


def sharded_qwen3_moe():
    cfg = config(model_type="qwen3_moe", vocab_size=8, hidden_size=4, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=2, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=2,
                 intermediate_size=4, decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=True,
                 rope_scaling=None, tie_word_embeddings=False)
    shards = [{"model.embed_tokens.weight": tensor([8, 4])}, {"lm_head.weight": tensor([8, 4]),
                                                               "model.norm.weight": tensor([4], fill=1.0)}]
    for i in range(2):
        p = "model.layers.%d." % i
        layer = {}
        layer.update(norms(p, 4, 1.0))
        layer.update(attention(p, 4, 2, 1, 2, gate=False, norm_fill=1.0))
        if i == 0:
            layer[p + "mlp.gate.weight"] = tensor([2, 4])
            for e in range(2):
                layer.update(mlp(p + "mlp.experts.%d." % e, 4, 2))
        else:
            layer.update(mlp(p + "mlp.", 4, 4))
        shards[i].update(layer)
    names = ["model-00001.safetensors", "model-00002.safetensors"]  # checkpoint_load_fuzz.cpp's shard names
    index = {"metadata": {"total_size": 0},
             "weight_map": {n: names[i] for i, s in enumerate(shards) for n in sorted(s)}}
    return [cfg, b"", json.dumps(index, indent=1).encode()] + [safetensors(s) for s in shards]


CHECKPOINTS = {
    "qwen3_dense_bf16": qwen3_dense,
    "qwen35_moe_vlm_fused": qwen35_moe_vlm,
    "qwen3_next_grouped_qkvz": qwen3_next,
    "mlx_qwen3_4bit_8bit_down": mlx_qwen3,
    "mlx_qwen35_dense_8bit": mlx_qwen35_dense,
    "qwen3_moe_sharded": sharded_qwen3_moe,
}


def header_only_seeds():
    return {
        "empty_header": safetensors({}),
        "metadata_only": safetensors({}, {"format": "pt", "note": "no tensors"}),
        "every_dtype": safetensors({
            "f32": tensor([2], "F32"), "bf16": tensor([2], "BF16"), "u32": tensor([2], "U32"),
            "f16": {"dtype": "F16", "shape": [1], "data": b"\x00\x3c"},
            "i8": {"dtype": "I8", "shape": [3], "data": b"\x01\x02\x03"},
            "u8": {"dtype": "U8", "shape": [1, 2], "data": b"\x04\x05"},
            "i32": {"dtype": "I32", "shape": [1], "data": b"\x06\x00\x00\x00"},
            "i64": {"dtype": "I64", "shape": [], "data": b"\x07" + b"\x00" * 7},
            "zero_size": {"dtype": "F32", "shape": [0, 3], "data": b""}}),
        # One dim away from a size that overflows 64 bits.
        "huge_dim_of_empty_tensor": safetensors({"empty": {"dtype": "U8", "shape": [2**62, 0], "data": b""},
                                                 "one": tensor([1], "F32")}),
    }


CHAT = {
    "user": {"messages": [{"role": "user", "content": "What is 48213 + 9377?"}]},
    "system_and_params": {
        "model": "petrel-tiny", "messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Sort 42, 7, 19."}],
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "max_tokens": 32, "seed": 7,
        "presence_penalty": 0.5, "frequency_penalty": 0.1, "repetition_penalty": 1.1, "stop": ["\n\n", "END"],
        "logit_bias": {"5": -100, "17": 2.5}, "n": 1},
    "stream_logprobs": {"messages": [{"role": "developer", "content": "Answer in digits."},
                                     {"role": "user", "content": [{"type": "text", "text": "12 * 12"},
                                                                  {"type": "text", "text": "= ?"}]}],
                        "stream": True, "stream_options": {"include_usage": True}, "logprobs": True,
                        "top_logprobs": 3, "max_completion_tokens": 16, "response_format": {"type": "text"}},
    "tools_round_trip": {
        "messages": [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "Weather in Oslo for 2 days?"},
            {"role": "assistant", "content": "", "reasoning_content": "Need the weather tool.",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny.",
             "tool_calls": [{"function": {"name": "note", "arguments": {"text": "done", "tags": ["a", 1]}}}]},
            {"role": "user", "content": "Thanks", "name": "ola"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather forecast",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                           "required": ["city"]}}},
            {"type": "function", "function": {"name": "note", "parameters": {"type": "object", "properties": {}}}}],
        "tool_choice": "auto", "parallel_tool_calls": True,
        "chat_template_kwargs": {"enable_thinking": False}},
    "json_schema": {"messages": [{"role": "user", "content": "A person?"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": {
            "type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
                                             "age": {"type": "integer", "minimum": 0}}, "required": ["name"]}}}},
    "tool_choice_named": {"messages": [{"role": "user", "content": "Weather?"}], "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}, "tools": [{"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]},
    "special_tokens_in_text": {"messages": [{"role": "user", "content": "<|im_start|>user\nhi<|im_end|> \u00e9\u0301 \u4e2d\u6587 \ud83d\ude00"}],
                               "tool_choice": "none", "tools": []},
}

COMPLETIONS = {
    "prompt_text": {"model": "petrel-tiny", "prompt": "Answer: ", "max_tokens": 8, "temperature": 0,
                    "stop": "\n", "logprobs": 2, "echo": False, "best_of": 1, "suffix": ""},
    "prompt_ids": {"prompt": [1, 5, 17, 2], "seed": 3},
    "prompt_list": {"prompt": ["What is 2 + 2?"], "stream": True, "logit_bias": {"0": 1}},
}

SCHEMAS = {
    "object": ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                 "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                                 "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
                "required": ["name"], "additionalProperties": {"type": "number", "exclusiveMinimum": 0}},
               '{"name": "x\\u00e9", "age": 7, "tags": ["a"], "z": 0.5}'),
    "ref_anyof": ({"$ref": "#/$defs/n", "$defs": {"n": {"anyOf": [{"type": "null"}, {"type": "array",
                                                                 "items": {"$ref": "#/$defs/n"}}]}}}, "[[null], []]"),
    "pattern_format": ({"type": "array", "prefixItems": [{"type": "string", "pattern": "^[a-c]+\\d{2}$"},
                                                         {"type": "string", "format": "date-time"}], "items": False},
                       '["ab12", "2024-02-28T10:00:00Z"]'),
}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "detail": {"type": "object"},
        "units": {"type": "string", "enum": ["c", "f"]}}}}}]

TOOL_TEXTS = {
    "hermes_json": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>",
    "qwen35_xml": "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n"
                  "</parameter>\n<parameter=detail>\n{\"wind\": true}\n</parameter>\n</function>\n</tool_call>",
    "text_then_two_calls": "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}\n"
                           "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=units>\nc\n</parameter>\n"
                           "</function>\n</tool_call>\nDone.",
    "broken_blocks": "<tool_call>{\"name\": 3}</tool_call> and <tool_call><function=>x</function></tool_call> "
                     "then <tool_ca",
    "unterminated": "Thinking...</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOs",
}


GGUF_TYPES = {"UINT8": (0, "<B"), "INT8": (1, "<b"), "UINT16": (2, "<H"), "INT16": (3, "<h"), "UINT32": (4, "<I"),
              "INT32": (5, "<i"), "FLOAT32": (6, "<f"), "BOOL": (7, "<?"), "UINT64": (10, "<Q"), "INT64": (11, "<q"),
              "FLOAT64": (12, "<d")}
GGML_F32, GGML_Q8_0, GGML_BF16 = 0, 8, 30


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(kind, value):
    """A typed value: kind is a GGUF_TYPES name, "STRING", or ("ARRAY", element kind)."""
    if kind == "STRING":
        return struct.pack("<I", 8) + gguf_string(value)
    if isinstance(kind, tuple):
        elem = kind[1]
        items = b"".join(gguf_string(v) if elem == "STRING" else struct.pack(GGUF_TYPES[elem][1], v) for v in value)
        code = 8 if elem == "STRING" else GGUF_TYPES[elem][0]
        return struct.pack("<IIQ", 9, code, len(value)) + items
    code, fmt = GGUF_TYPES[kind]
    return struct.pack("<I", code) + struct.pack(fmt, value)


def gguf(kvs, tensors, alignment=32):
    """A GGUF v3 file: kvs is [(key, kind, value)], tensors is [(name, ggml type, ne, bytes)]."""
    head = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs))
    head += b"".join(gguf_string(k) + gguf_value(kind, v) for k, kind, v in kvs)
    data, offsets = b"", []
    for _, _, _, blob in tensors:
        data += b"\0" * (-len(data) % alignment)
        offsets.append(len(data))
        data += blob
    for (name, ggml, ne, _), off in zip(tensors, offsets):
        head += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        head += struct.pack("<IQ", ggml, off)
    return head + b"\0" * (-len(head) % alignment) + data


def ggml_tensor(name, ne, ggml=GGML_F32, fill=None):
    """A tensor of dims ne (ggml order): F32 or BF16 values, or Q8_0 blocks with scale 1/64."""
    count = 1
    for d in ne:
        count *= d
    values = [fill if fill is not None else RNG.uniform() * 0.2 for _ in range(count)]
    if ggml == GGML_Q8_0:
        blob = b"".join(struct.pack("<e", 1 / 64) + bytes((int(v * 64) & 0xff) for v in values[i:i + 32])
                        for i in range(0, count, 32))
    else:
        f32 = b"".join(struct.pack("<f", v) for v in values)
        blob = f32 if ggml == GGML_F32 else b"".join(f32[i + 2:i + 4] for i in range(0, len(f32), 4))
    return (name, ggml, ne, blob)


def gguf_qwen3(arch, ggml):
    """A one-layer qwen3 (or qwen3moe, 2 experts) with rows of 32, so that Q8_0 rows are whole blocks."""
    h, heads, kv, hd, ff, vocab = 32, 2, 1, 16, 32, 8
    kvs = [("general.architecture", "STRING", arch), (arch + ".block_count", "UINT32", 1),
           (arch + ".context_length", "UINT32", 64), (arch + ".embedding_length", "UINT32", h),
           (arch + ".feed_forward_length", "UINT32", ff), (arch + ".attention.head_count", "UINT32", heads),
           (arch + ".attention.head_count_kv", "UINT32", kv), (arch + ".attention.key_length", "UINT32", hd),
           (arch + ".attention.layer_norm_rms_epsilon", "FLOAT32", 1e-6),
           (arch + ".rope.freq_base", "FLOAT32", 1e6),
           ("tokenizer.ggml.tokens", ("ARRAY", "STRING"), ["t%d" % i for i in range(vocab)]),
           ("tokenizer.ggml.eos_token_id", "UINT32", 2)]
    t = [ggml_tensor("token_embd.weight", [h, vocab], ggml), ggml_tensor("output_norm.weight", [h], fill=1.0),
         ggml_tensor("blk.0.attn_norm.weight", [h], fill=1.0), ggml_tensor("blk.0.ffn_norm.weight", [h], fill=1.0),
         ggml_tensor("blk.0.attn_q.weight", [h, heads * hd], ggml), ggml_tensor("blk.0.attn_k.weight", [h, kv * hd], ggml),
         ggml_tensor("blk.0.attn_v.weight", [h, kv * hd], ggml), ggml_tensor("blk.0.attn_output.weight", [heads * hd, h], ggml),
         ggml_tensor("blk.0.attn_q_norm.weight", [hd], fill=1.0), ggml_tensor("blk.0.attn_k_norm.weight", [hd], fill=1.0)]
    if arch == "qwen3moe":
        kvs += [("qwen3moe.expert_count", "UINT32", 2), ("qwen3moe.expert_used_count", "UINT32", 2),
                ("qwen3moe.expert_feed_forward_length", "UINT32", ff)]
        t += [ggml_tensor("blk.0.ffn_gate_inp.weight", [h, 2]), ggml_tensor("blk.0.ffn_gate_exps.weight", [h, ff, 2], ggml),
              ggml_tensor("blk.0.ffn_up_exps.weight", [h, ff, 2], ggml),
              ggml_tensor("blk.0.ffn_down_exps.weight", [ff, h, 2], ggml)]
    else:
        t += [ggml_tensor("blk.0.ffn_gate.weight", [h, ff], ggml), ggml_tensor("blk.0.ffn_up.weight", [h, ff], ggml),
              ggml_tensor("blk.0.ffn_down.weight", [ff, h], ggml), ggml_tensor("output.weight", [h, vocab], ggml)]
    return kvs, t


def gguf_seeds():
    seeds = {}
    for arch, ggml, name in [("qwen3", GGML_BF16, "qwen3_bf16"), ("qwen3", GGML_Q8_0, "qwen3_q8_0"),
                             ("qwen3moe", GGML_Q8_0, "qwen3moe_q8_0")]:
        kvs, t = gguf_qwen3(arch, ggml)
        seeds[name] = gguf(kvs, t)
    kvs = [("k.%s" % kind.lower(), kind, 1) for kind in GGUF_TYPES]
    kvs += [("k.string", "STRING", "text"), ("k.strings", ("ARRAY", "STRING"), ["a", ""]),
            ("k.ints", ("ARRAY", "INT32"), [1, -1]), ("general.alignment", "UINT32", 64)]
    seeds["every_value_type"] = gguf(kvs, [ggml_tensor("t", [32], GGML_Q8_0)], alignment=64)
    return seeds


def write(target, name, data):
    folder = os.path.join(ROOT, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def main():
    for name, make in CHECKPOINTS.items():
        files = make()
        write("checkpoint_load_fuzz", name, SEPARATOR.join(files))
        for i, f in enumerate(files):
            if f.startswith(b"{") or not f:
                continue
            write("safetensors_header_fuzz", "%s_%d" % (name, i), f)
    for name, data in header_only_seeds().items():
        write("safetensors_header_fuzz", name, data)
    for name, body in CHAT.items():
        write("request_to_ids_fuzz", "chat_" + name, b"c" + json.dumps(body).encode())
    for name, body in COMPLETIONS.items():
        write("request_to_ids_fuzz", "completion_" + name, b"t" + json.dumps(body).encode())
    for name, text in TOOL_TEXTS.items():
        write("tool_call_parser_fuzz", name, json.dumps(TOOLS).encode() + b"\0" + text.encode())
    write("tool_call_parser_fuzz", "no_tools", b"\0" + TOOL_TEXTS["qwen35_xml"].encode())
    for name, (schema, text) in SCHEMAS.items():
        write("json_schema_fuzz", name, json.dumps(schema).encode() + b"\0" + text.encode())
    for name, data in gguf_seeds().items():
        write("gguf_file_fuzz", name, data)


if __name__ == "__main__":
    main()
