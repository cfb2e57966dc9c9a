#!/usr/bin/env python3
"""Converts the Hugging Face fixture checkpoints (tests/fixtures/models/*) with llama.cpp's own
converter, convert_hf_to_gguf.py, to F16, BF16 and Q8_0 GGUF files under
tests/fixtures/gguf/models/ (NAME-F16.gguf, ...), which tests/unit/gguf_converter_test.cpp
compares with the safetensors runs. Only the bf16 fixtures are converted, for which F16 and BF16
are lossless, so the logits must agree to rounding. Q8_0 rounds the weights, and on these small
random models the logits of rounded weights drift by more than any fixed bound that would still
catch a reading error: the test compares a Q8_0 file with its dequantized copy instead
(tools/gguf/make_dequantized_copies.py). The test uses the Q8_0 files of two fixtures.

Needs torch, transformers and numpy (the GPU machine has them; no network is used) and the
vendored converter, by default the copy in the shared folder beside the
repository (shared/third_party/llama.cpp-gguf):

    python3 tools/gguf/make_converter_fixtures.py [--llama-cpp DIR] [--out tests/fixtures/gguf/models]
        [--only NAME,NAME]   (convert only these fixtures)

The fixtures have no tokenizer, which the converter requires, so each is converted from a
temporary copy holding a byte-level BPE tokenizer of exactly their 256 ids (one per byte, no
merges) in Qwen2's format. The converter names a tokenizer's pre-tokenizer by hashing the ids it
gives a probe text and knows only published tokenizers, so the run tells it this one is "qwen2"
(the regex the synthetic tokenizer.json uses). Qwen3.5 fixtures are converted with --no-mtp: their
configs carry no mtp_num_hidden_layers for the mtp.* tensors some of them hold.
"""
import argparse
import json
import os
import runpy
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_LLAMA_CPP = os.path.join(os.path.dirname(REPO), "shared", "third_party", "llama.cpp-gguf")
FIXTURES = os.path.join(REPO, "tests", "fixtures", "models")
OUTTYPES = {"F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_symbols():
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the
    others take code points from 256 on, in byte order."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    symbols, extra = [], 0
    for b in range(256):
        if b in keep:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def write_tokenizer(folder):
    vocab = {s: i for i, s in enumerate(byte_symbols())}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}, f)


def hf_fixtures():
    """The bf16 fixture folders in Hugging Face's format that the converter can express (the MLX
    ones are not its input)."""
    names = []
    for name in sorted(os.listdir(FIXTURES)):
        folder = os.path.join(FIXTURES, name)
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        if "quantization" in config or "quantization_config" in config or name.endswith("-f32"):
            continue
        if config.get("model_type") == "qwen3_moe" and config.get("mlp_only_layers"):
            # llama.cpp's qwen3moe architecture makes every layer sparse: it cannot hold a dense one.
            print(f"skipped {name}: its dense layers {config['mlp_only_layers']} have no qwen3moe GGUF form")
            continue
        names.append(name)
    return names


def is_qwen35(folder):
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    return any(a.startswith("Qwen3_5") for a in config.get("architectures") or [])


def convert(llama_cpp, folder, outtype, outfile, no_mtp):
    """Runs convert_hf_to_gguf.py in this process, its pre-tokenizer lookup answered with qwen2."""
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outtype", outtype, "--outfile", outfile]
    if no_mtp:
        sys.argv.append("--no-mtp")
    from conversion.base import TextModel
    TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    runpy.run_path(os.path.join(llama_cpp, "convert_hf_to_gguf.py"), run_name="__main__")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", default=DEFAULT_LLAMA_CPP, help="the vendored llama.cpp converter folder")
    parser.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "gguf", "models"))
    parser.add_argument("--only", default="", help="comma-separated fixture names to convert (default: every one)")
    args = parser.parse_args()
    names = hf_fixtures()
    only = set(filter(None, args.only.split(",")))
    if only - set(names):
        sys.exit(f"--only: {', '.join(sorted(only - set(names)))} not among the convertible fixtures {', '.join(names)}")
    sys.path.insert(0, args.llama_cpp)
    sys.path.insert(1, os.path.join(args.llama_cpp, "gguf-py"))
    os.makedirs(args.out, exist_ok=True)
    failed = []
    for name in (n for n in names if not only or n in only):
        with tempfile.TemporaryDirectory() as work:
            folder = os.path.join(work, name)
            shutil.copytree(os.path.join(FIXTURES, name), folder)
            write_tokenizer(folder)
            for label, outtype in OUTTYPES.items():
                outfile = os.path.join(args.out, f"{name}-{label}.gguf")
                try:
                    convert(args.llama_cpp, folder, outtype, outfile, is_qwen35(folder))
                    print(f"wrote {os.path.relpath(outfile, REPO)}")
                except (Exception, SystemExit) as e:  # one fixture the converter refuses must not stop the rest
                    failed.append(f"{name} {label}: {e!r}")
    for line in failed:
        print(f"converter failed: {line}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
