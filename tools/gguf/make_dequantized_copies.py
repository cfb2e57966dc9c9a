#!/usr/bin/env python3
"""Writes, beside each quantized GGUF fixture (tests/fixtures/gguf/models/NAME-Q8_0.gguf), a copy
whose quantized tensors gguf-py has dequantized to F32 (NAME-Q8_0-as-F32.gguf): the same
metadata, names, shapes and unquantized tensors. tests/unit/gguf_converter_test.cpp requires
Petrel's logits for the two files to agree, which checks Petrel's quantized path against llama.cpp's
own dequantization on whole models, apart from the weights' rounding (which the comparison with
the safetensors run cannot separate from a reading error on small random models).

Needs numpy (Debian: python3-numpy) and llama.cpp's gguf-py, by default the copy in the shared
folder beside the repository (shared/third_party/llama.cpp-gguf/gguf-py):

    python3 tools/gguf/make_dequantized_copies.py [--gguf-py DIR] [FILE.gguf ...]
"""
import argparse
import glob
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_GGUF_PY = os.path.join(os.path.dirname(REPO), "shared", "third_party", "llama.cpp-gguf", "gguf-py")
MODELS = os.path.join(REPO, "tests", "fixtures", "gguf", "models")


def copy_fields(gguf, reader, writer):
    """Every key-value field but those GGUFWriter writes itself."""
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)


def dequantized_copy(gguf, path, out):
    reader = gguf.GGUFReader(path)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(out, arch)
    copy_fields(gguf, reader, writer)
    keep = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    for t in reader.tensors:
        if t.tensor_type in keep:
            writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
        else:
            values = gguf.quants.dequantize(t.data, t.tensor_type)
            writer.add_tensor(t.name, values.astype("float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf-py", default=DEFAULT_GGUF_PY, help="the vendored gguf-py folder")
    parser.add_argument("files", nargs="*", help="quantized GGUF files (default: every *-Q8_0.gguf fixture)")
    args = parser.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf  # noqa: E402 (the vendored copy, found through the path above)

    for path in args.files or sorted(glob.glob(os.path.join(MODELS, "*-Q8_0.gguf"))):
        out = path[: -len(".gguf")] + "-as-F32.gguf"
        dequantized_copy(gguf, path, out)
        print(f"wrote {os.path.relpath(out, REPO)}")


if __name__ == "__main__":
    main()
