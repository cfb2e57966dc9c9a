#!/usr/bin/env python3
"""Trains petrel-tiny's byte-level BPE tokenizer with Hugging Face `tokenizers` on task text.

Needs the `tokenizers` package (the GPU machine has it); train.py calls it, or on its own:

    python3 tools/tiny/train_tokenizer.py --out models/petrel-tiny

Writes tokenizer.json and tokenizer_config.json (chat template, eos <|im_end|>, pad
<|endoftext|>) into --out. The pipeline is Qwen's: NFC, the Qwen2/Qwen3 split regex (every digit
is its own piece, so numbers are always tokenized digit by digit), byte-level symbols, BPE.
Merges are kept only when their pair occurs in at least --min-frequency-share of the corpus's
examples: the fixed words of the task phrasing merge into whole-word tokens, while the random
letter strings of the word tasks stay (nearly) one token per letter.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS_SEED = 7


def corpus(n_examples, seed=CORPUS_SEED):
    """The text between special tokens of n chat examples, as the tokenizer will see it."""
    exclude = {e.key for e in tasks.heldout()}
    stream = tasks.training_stream(seed, exclude)
    for _ in range(n_examples):
        ex = next(stream)
        yield "user\n" + ex.question
        yield "\n"
        yield "assistant\n" + ex.response


def train(n_examples=100_000, min_frequency_share=0.03, vocab_cap=2048):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [AddedToken(t, special=True, normalized=False) for t in tasks.SYSTEM_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_cap, min_frequency=max(2, int(n_examples * min_frequency_share)),
        special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(n_examples), trainer=trainer, length=3 * n_examples)
    return tok


def tokenizer_config(tok):
    added = {}
    for t in tasks.SYSTEM_TOKENS:
        added[str(tok.token_to_id(t))] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": tasks.CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": tasks.IM_END,
        "errors": "replace",
        "model_max_length": 2048,
        "pad_token": tasks.PAD,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def write(tok, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(tok), f, indent=2)
        f.write("\n")


def describe(tok):
    vocab = tok.get_vocab()
    merged = sorted((i, t) for t, i in vocab.items() if len(t) > 1 and t not in tasks.SYSTEM_TOKENS)
    lines = [f"vocab {tok.get_vocab_size()} ({len(merged)} merged tokens)",
             "merged: " + " ".join(t for _, t in merged)]
    rng = random.Random(3)
    for task, make in tasks.MAKERS.items():
        ex = make(rng)
        text = tasks.render_chat([{"role": "user", "content": ex.question}]) + ex.response + tasks.IM_END
        lines.append(f"{task}: {tok.encode(text, add_special_tokens=False).tokens}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--examples", type=int, default=100_000)
    args = ap.parse_args()
    tok = train(args.examples)
    write(tok, args.out)
    print(describe(tok))


if __name__ == "__main__":
    main()
