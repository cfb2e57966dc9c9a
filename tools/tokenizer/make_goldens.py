#!/usr/bin/env python3
"""Writes reference outputs for the tokenizer and chat-template tests.

Oracles: Hugging Face `tokenizers` for ids and decodes, `transformers.apply_chat_template`
for chat renders, and Jinja2 configured exactly as transformers configures it for the small
feature templates. Run it where those are installed (the GPU machine), after
scripts/fetch-test-data.sh and tools/tokenizer/make_corpus.py:

  python3 tools/tokenizer/make_goldens.py --out DIR

It writes encode_goldens.json, decode_goldens.json, render_goldens.json and
jinja_feature_goldens.json into DIR; copy them to tests/fixtures/tokenizer/.
With --jinja-only only the two render files are written, from Jinja2 alone (no transformers).
"""
import argparse
import copy
import json
import pathlib
import random
import sys
from datetime import datetime

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/tokenizer"
QWEN3_DIR = ROOT / "tests/fixtures/.cache/qwen3-tokenizer"
QWEN3_5_TEMPLATE = FIXTURES / "qwen3_5_chat_template.jinja"


def load(name):
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def write(path, value):
    # One case per line keeps the files small and their diffs readable.
    if isinstance(value, dict):
        lines = [f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}" for k, v in value.items()]
        text = "{\n" + ",\n".join(lines) + "\n}\n"
    else:
        text = "[\n" + ",\n".join(json.dumps(v, ensure_ascii=False) for v in value) + "\n]\n"
    path.write_text(text, encoding="utf-8")
    print(f"{path.name}: {len(text.encode())} bytes")


def apply_patches(data, patches):
    data = copy.deepcopy(data)
    for patch in patches:
        node = data
        for key in patch["path"][:-1]:
            node = node[key]
        last = patch["path"][-1]
        if patch["op"] == "set":
            node[last] = patch["value"]
        elif patch["op"] == "append":
            node[last].append(patch["value"])
        else:
            raise ValueError(f"unknown patch op {patch['op']}")
    return data


def encode_goldens(out):
    import tokenizers
    from tokenizers import Tokenizer

    print(f"tokenizers {tokenizers.__version__}")
    base = json.loads((QWEN3_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    corpus = load("corpus.json")
    result = {"qwen3": {name: Tokenizer.from_str(json.dumps(base)).encode(text, add_special_tokens=False).ids
                        for name, text in corpus.items()}}
    for variant in load("variants.json"):
        tok = Tokenizer.from_str(json.dumps(apply_patches(base, variant["patches"])))
        texts = {**corpus, **variant.get("extra_corpus", {})}
        result[variant["name"]] = {name: tok.encode(text, add_special_tokens=False).ids for name, text in texts.items()}
    write(out / "encode_goldens.json", result)
    return Tokenizer.from_str(json.dumps(base)), result["qwen3"]


def decode_goldens(out, tok, encodings):
    """Whole encodings, specials skipped or kept, and random slices that cut UTF-8 sequences."""
    rng = random.Random(7)
    cases = []
    for name, ids in encodings.items():
        cases.append({"name": name, "ids": ids, "skip_special": False, "text": tok.decode(ids, skip_special_tokens=False)})
        if name.startswith("specials"):
            cases.append({"name": name + "/skip", "ids": ids, "skip_special": True,
                          "text": tok.decode(ids, skip_special_tokens=True)})
    for name in ["emoji_zwj", "emoji_modifiers", "chinese", "astral", "devanagari", "arabic", "combining_marks"]:
        ids = encodings[name]
        for i in range(6):
            a = rng.randrange(len(ids))
            b = min(len(ids), a + rng.randrange(1, 4))
            sl = ids[a:b]
            cases.append({"name": f"{name}/slice{i}", "ids": sl, "skip_special": False,
                          "text": tok.decode(sl, skip_special_tokens=False)})
        cases.append({"name": f"{name}/reversed", "ids": ids[::-1], "skip_special": False,
                      "text": tok.decode(ids[::-1], skip_special_tokens=False)})
    write(out / "decode_goldens.json", cases)


def raise_exception(message):
    from jinja2.exceptions import TemplateError
    raise TemplateError(message)


def hf_environment():
    """The Jinja2 environment transformers builds for chat templates (same settings)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        return lambda text: _compile_jinja_template(text), "transformers"
    except ImportError:
        pass
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string, "jinja2 replica"


def outcome(render):
    try:
        return {"text": render()}
    except Exception as e:  # the error itself is the reference outcome
        return {"error": f"{type(e).__name__}: {e}"}


def special_token_vars(config):
    names = ["bos_token", "eos_token", "unk_token", "pad_token"]
    out = {}
    for name in names:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    if config.get("additional_special_tokens"):
        out["additional_special_tokens"] = config["additional_special_tokens"]
    return out


def render_goldens(out, jinja_only):
    config = json.loads((QWEN3_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    templates = {"qwen3": config["chat_template"], "qwen3_5": QWEN3_5_TEMPLATE.read_text(encoding="utf-8")}
    compile_template, env_name = hf_environment()
    print(f"chat templates rendered by: {'jinja2 replica' if jinja_only else 'transformers.apply_chat_template'}"
          f"; feature templates by: {env_name}")
    tokenizer = None
    if not jinja_only:
        import transformers
        print(f"transformers {transformers.__version__}")
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(QWEN3_DIR))
    specials = special_token_vars(config)
    result = {}
    for tname, template in templates.items():
        compiled = compile_template(template)
        for conv in load("conversations.json"):
            kwargs = conv.get("kwargs", {})
            gen = conv["add_generation_prompt"]
            if tokenizer is not None:
                render = lambda: tokenizer.apply_chat_template(
                    conv["messages"], tools=conv.get("tools"), add_generation_prompt=gen, tokenize=False,
                    chat_template=template, **kwargs)
            else:
                render = lambda: compiled.render(messages=conv["messages"], tools=conv.get("tools"),
                                                 documents=None, add_generation_prompt=gen, **specials, **kwargs)
            result[f"{tname}/{conv['name']}"] = outcome(render)
    write(out / "render_goldens.json", result)

    features = load("jinja_features.json")
    fresult = {name: outcome(lambda: compile_template(text).render(**features["vars"]))
               for name, text in features["templates"].items()}
    write(out / "jinja_feature_goldens.json", fresult)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--jinja-only", action="store_true")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (QWEN3_DIR / "tokenizer.json").exists():
        sys.exit("missing Qwen3 tokenizer: run scripts/fetch-test-data.sh")
    if not args.jinja_only:
        tok, encodings = encode_goldens(out)
        decode_goldens(out, tok, encodings)
    render_goldens(out, args.jinja_only)


if __name__ == "__main__":
    main()
