#!/usr/bin/env python3
"""Trains petrel-tiny (Qwen3.5-MoE text architecture) with Hugging Face transformers, end to end.

Runs on a CUDA machine with torch, transformers 5.x, tokenizers, safetensors and numpy:

    python3 tools/tiny/train.py --out models/petrel-tiny --time-budget 270

  1. trains the byte-level BPE tokenizer (train_tokenizer.py) and writes its files;
  2. generates the training set (tasks.py; the 200 held-out problems are excluded) and tokenizes it;
  3. trains with AdamW for --time-budget seconds of training (or exactly --steps steps): the
     learning-rate schedule follows the fraction of the budget used, so the run ends on time
     whatever the machine's speed; the step count reached is printed and recorded;
  4. rounds the weights to bf16 and, with those weights, measures greedy accuracy on the held-out
     problems with HF, writes model.safetensors (bf16), config.json, generation_config.json, and
     the references the C++ tests compare against (--out/reference/):
       heldout.jsonl   the 200 problems: question, expected response and answer, the chat prompt
                       as transformers' apply_chat_template renders it, the ids HF `tokenizers`
                       gives for prompt / question / response, and HF's greedy response;
       hf_logits.npy   float32 [sum of lengths, vocab]: HF fp32 logits (CPU, eager attention) at
                       every position of 10 held-out prompts followed by HF's greedy answer;
       reference.json  those 10 sequences (ids, offsets into hf_logits.npy), versions, and the
                       training figures (steps, wall time, final loss, accuracy).
With --init-from DIR it starts from DIR's weights and tokenizer instead (a continuation run).
Before training, every step after it is run once on the untrained model (--out/.smoke), so a
mistake there shows in seconds rather than after the budget is spent.
"""
import argparse
import copy
import json
import math
import os
import random
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402
import train_tokenizer  # noqa: E402

SEED = 1234
N_LOGIT_PROMPTS = 10


def log(*args):
    print(*args, flush=True)


# ----------------------------------------------------------------------------- model

def model_config(vocab_size, pad_id, eos_id):
    return transformers.Qwen3_5MoeTextConfig(
        vocab_size=vocab_size, hidden_size=256, num_hidden_layers=6,
        layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=256,
        router_aux_loss_coef=0.01,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=2048, hidden_act="silu",
        attention_bias=False, initializer_range=0.02,
        partial_rotary_factor=0.5,  # the config also reads it here (default 0.25)
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                             mrope_section=[6, 5, 5], mrope_interleaved=True),
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id,
    )


def pick_experts_implementation(model, device, vocab):
    """grouped_mm when it runs forward and backward here, else eager (HF's per-expert loop)."""
    if not hasattr(model, "set_experts_implementation"):
        return "default"
    x = torch.randint(3, vocab, (4, 16), device=device)
    model.set_experts_implementation("eager")
    with torch.no_grad():
        want = model(input_ids=x, use_cache=False).logits.float()
    for impl in ("grouped_mm", "eager"):
        try:
            model.set_experts_implementation(impl)
            out = model(input_ids=x, use_cache=False)
            out.logits.float().sum().backward()
            model.zero_grad(set_to_none=True)
            err = float((out.logits.float() - want).abs().max() / want.abs().max())
            if err > 1e-2:
                raise ValueError(f"logits differ from eager by {err:.3g} (relative)")
            return impl
        except Exception as e:  # noqa: BLE001 - any failure means: use the next one
            log(f"experts implementation {impl} unusable here: {type(e).__name__}: {str(e)[:200]}")
            model.zero_grad(set_to_none=True)
    raise RuntimeError("no experts implementation works")


def fused_state_dict(model, dtype):
    """The model's tensors in the released layout (experts fused: gate_up_proj [E,2I,H], down_proj [E,H,I])."""
    sd = {k: v.detach().to(dtype).contiguous().cpu() for k, v in model.state_dict().items()}
    per = {}
    for k in list(sd):
        parts = k.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            per.setdefault(".".join(parts[: i + 1]), {})[(int(parts[i + 1]), parts[i + 2])] = sd.pop(k)
    for base, d in per.items():
        n = 1 + max(e for e, _ in d)
        sd[base + ".gate_up_proj"] = torch.stack([torch.cat([d[(e, "gate_proj")], d[(e, "up_proj")]]) for e in range(n)])
        sd[base + ".down_proj"] = torch.stack([d[(e, "down_proj")] for e in range(n)])
    return sd


def load_weights(model, path):
    sd = {k: v for k, v in load_file(path).items() if not k.startswith("mtp.")}  # the trunk's (train_mtp.py adds a head)
    own = model.state_dict()
    missing = set(own) - set(sd)
    if missing:  # this transformers holds experts one by one: split the fused tensors
        for k in list(sd):
            if k.endswith("experts.gate_up_proj"):
                base, t = k[: -len("gate_up_proj")], sd.pop(k)
                half = t.shape[1] // 2
                for e in range(t.shape[0]):
                    sd[f"{base}{e}.gate_proj.weight"], sd[f"{base}{e}.up_proj.weight"] = t[e, :half], t[e, half:]
            elif k.endswith("experts.down_proj"):
                base, t = k[: -len("down_proj")], sd.pop(k)
                for e in range(t.shape[0]):
                    sd[f"{base}{e}.down_proj.weight"] = t[e]
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)


def config_json(model):
    d = model.config.to_dict()
    for k in list(d):
        if k.startswith("_") or k in ("transformers_version", "torch_dtype", "dtype", "output_router_logits"):
            d.pop(k)
    d["architectures"] = ["Qwen3_5MoeForCausalLM"]
    d["model_type"] = "qwen3_5_moe_text"
    d["dtype"] = "bfloat16"
    d["transformers_version"] = transformers.__version__
    return d


# ----------------------------------------------------------------------------- data

class Encoded:
    """Token ids of examples, each split as prompt (no loss) + response with <|im_end|> (loss)."""

    def __init__(self, tok, examples):
        prompts = [tasks.render_chat([{"role": "user", "content": e.question}]) for e in examples]
        responses = [e.response + tasks.IM_END for e in examples]
        self.prompt = [enc.ids for enc in tok.encode_batch(prompts, add_special_tokens=False)]
        self.response = [enc.ids for enc in tok.encode_batch(responses, add_special_tokens=False)]


def pack_single(enc, pad_id):
    """ids [N, L] int64 padded with pad_id, loss mask [N, L] bool (True on response tokens)."""
    L = max(len(p) + len(r) for p, r in zip(enc.prompt, enc.response))
    ids = np.full((len(enc.prompt), L), pad_id, dtype=np.int64)
    mask = np.zeros((len(enc.prompt), L), dtype=bool)
    for i, (p, r) in enumerate(zip(enc.prompt, enc.response)):
        ids[i, : len(p) + len(r)] = p + r
        mask[i, len(p): len(p) + len(r)] = True
    return torch.from_numpy(ids), torch.from_numpy(mask)


def pack_chats(enc, n_chats, pad_id, nl_id, rng):
    """Chats of 2-3 turns drawn from the encoded pool ("\n" between turns), loss on every answer."""
    rows = []
    for _ in range(n_chats):
        ids, spans = [], []
        for j in range(rng.randint(2, 3)):
            i = rng.randrange(len(enc.prompt))
            if j:
                ids.append(nl_id)
            ids += enc.prompt[i]
            spans.append((len(ids), len(ids) + len(enc.response[i])))
            ids += enc.response[i]
        rows.append((ids, spans))
    L = max(len(r[0]) for r in rows)
    ids = np.full((n_chats, L), pad_id, dtype=np.int64)
    mask = np.zeros((n_chats, L), dtype=bool)
    for i, (r, spans) in enumerate(rows):
        ids[i, : len(r)] = r
        for a, b in spans:
            mask[i, a:b] = True
    return torch.from_numpy(ids), torch.from_numpy(mask)


def build_training_data(tok, n_single, n_multi, pad_id, nl_id, seed):
    t0 = time.time()
    exclude = {e.key for e in tasks.heldout()}
    stream = tasks.training_stream(seed, exclude)
    examples = [next(stream) for _ in range(n_single)]
    t1 = time.time()
    enc = Encoded(tok, examples)
    t2 = time.time()
    s_ids, s_mask = pack_single(enc, pad_id)
    m_ids, m_mask = pack_chats(enc, n_multi, pad_id, nl_id, random.Random(seed + 1))
    n_tok = int((s_ids != pad_id).sum() + (m_ids != pad_id).sum())
    log(f"data: {n_single} single-turn examples (padded to {s_ids.shape[1]}), {n_multi} chats of 2-3 turns "
        f"(padded to {m_ids.shape[1]}), {n_tok / 1e6:.1f}M tokens; generated in {t1 - t0:.1f} s, "
        f"tokenized in {t2 - t1:.1f} s, packed in {time.time() - t2:.1f} s")
    counts = {}
    for e in examples:
        counts[e.task] = counts.get(e.task, 0) + 1
    log("task mix:", counts)
    return (s_ids, s_mask), (m_ids, m_mask), n_tok


# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def greedy_batch(model, prompts, max_new, eos_id, pad_id, device):
    """HF greedy decoding of many prompts at once, no cache: right padding is harmless to a causal
    model, so every row reads its own next-token logits at its own length."""
    n = len(prompts)
    lens = torch.tensor([len(p) for p in prompts], device=device)
    buf = torch.full((n, int(lens.max()) + max_new), pad_id, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        buf[i, : len(p)] = torch.tensor(p, device=device)
    cur, done, rows = lens.clone(), torch.zeros(n, dtype=torch.bool, device=device), torch.arange(n, device=device)
    for _ in range(max_new):
        L = int(cur.max())
        logits = model(input_ids=buf[:, :L], use_cache=False).logits
        nxt = logits[rows, cur - 1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        buf[rows, cur] = nxt
        cur = cur + (~done).long()
        done = done | (nxt == eos_id)
        if bool(done.all()):
            break
    out = []
    for i, p in enumerate(prompts):
        gen = buf[i, len(p):].tolist()
        out.append(gen[: gen.index(eos_id)] if eos_id in gen else gen)
    return out


def evaluate(model, tok, problems, prompt_ids, eos_id, pad_id, device, max_new=48, label="held-out"):
    was_training = model.training
    model.eval()
    t0 = time.time()
    gens = greedy_batch(model, prompt_ids, max_new, eos_id, pad_id, device)
    nv = tok.get_vocab_size()  # ids past the tokenizer's vocabulary (padding rows) decode to nothing
    texts = [tok.decode([i for i in g if i < nv], skip_special_tokens=False) for g in gens]
    per, right = {}, 0
    for ex, text in zip(problems, texts):
        ok = tasks.final_line(text) == ex.answer
        right += ok
        a, b = per.get(ex.task, (0, 0))
        per[ex.task] = (a + ok, b + 1)
    acc = right / len(problems)
    log(f"{label} accuracy {acc:.3f} ({right}/{len(problems)}) " +
        " ".join(f"{t}={a}/{b}" for t, (a, b) in per.items()) + f" [{time.time() - t0:.1f} s]")
    if was_training:
        model.train()
    return acc, per, gens, texts


# ----------------------------------------------------------------------------- training

def lr_at(step, progress, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def draw_batch(step, single, multi, batch, gen):
    """Step's batch: every 5th step batch/4 chats, else `batch` single-turn examples (ids, loss mask)."""
    ids, mask = multi if step % 5 == 4 else single
    idx = torch.randint(0, ids.shape[0], (batch // 4 if step % 5 == 4 else batch,), device=ids.device, generator=gen)
    return ids[idx], mask[idx]


def train(model, single, multi, args, device, eval_fn):
    s_ids, s_mask = single[0].to(device), single[1].to(device)
    m_ids, m_mask = multi[0].to(device), multi[1].to(device)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8,
                            **({"fused": True} if device.type == "cuda" else {}))
    gen = torch.Generator(device=device).manual_seed(SEED)
    model.train()
    step, train_s, ema, last_log = 0, 0.0, None, time.time()
    eval_points = [0.4, 0.75]
    history = []
    while True:
        progress = step / args.steps if args.steps else train_s / args.time_budget
        if progress >= 1.0:
            break
        if eval_points and progress >= eval_points[0]:
            eval_points.pop(0)
            history.append({"step": step, "train_s": round(train_s, 1), "accuracy": eval_fn()[0]})
        t0 = time.time()
        lr = lr_at(step, progress, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x, m = draw_batch(step, (s_ids, s_mask), (m_ids, m_mask), args.batch, gen)
        out = model(input_ids=x, use_cache=False, output_router_logits=True)
        sel = m[:, 1:]
        ce = F.cross_entropy(out.logits[:, :-1][sel].float(), x[:, 1:][sel])
        aux = out.aux_loss if getattr(out, "aux_loss", None) is not None else torch.zeros((), device=device)
        loss = ce + model.config.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ce_v = float(ce)
        ema = ce_v if ema is None else 0.98 * ema + 0.02 * ce_v
        step += 1
        train_s += time.time() - t0
        if step % 100 == 0 or time.time() - last_log > 20:
            last_log = time.time()
            log(f"step {step:5d}  loss {ce_v:.4f} (ema {ema:.4f})  aux {float(aux):.3f}  |g| {float(gnorm):.2f}  "
                f"lr {lr:.2e}  {train_s:6.1f} s  {step / train_s:.1f} steps/s")
    log(f"trained {step} steps in {train_s:.1f} s ({step / train_s:.2f} steps/s); final loss ema {ema:.4f}")
    return {"steps": step, "train_seconds": round(train_s, 1), "final_loss_ema": round(ema, 5),
            "final_loss_last_batch": round(ce_v, 5), "history": history}


# ----------------------------------------------------------------------------- outputs

def write_model_files(model, out_dir, eos_id, pad_id):
    os.makedirs(out_dir, exist_ok=True)
    save_file(fused_state_dict(model, torch.bfloat16), os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_json(model), f, indent=2, sort_keys=True)
        f.write("\n")
    gen_cfg = {"do_sample": False, "eos_token_id": eos_id, "pad_token_id": pad_id, "max_new_tokens": 64,
               "transformers_version": transformers.__version__}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
        f.write("\n")


def hf_chat_prompts(out_dir, problems):
    """The prompts as transformers renders them from our tokenizer_config.json (None if it can't)."""
    try:
        hf_tok = transformers.AutoTokenizer.from_pretrained(out_dir)
        return [hf_tok.apply_chat_template([{"role": "user", "content": e.question}], tokenize=False,
                                           add_generation_prompt=True) for e in problems]
    except Exception as e:  # noqa: BLE001
        log(f"WARNING: transformers could not render the chat template: {type(e).__name__}: {e}")
        return None


def write_references(model, tok, out_dir, problems, prompt_ids, gens, texts, figures):
    ref_dir = os.path.join(out_dir, "reference")
    os.makedirs(ref_dir, exist_ok=True)
    rendered = hf_chat_prompts(out_dir, problems)
    ours = [tasks.render_chat([{"role": "user", "content": e.question}]) for e in problems]
    if rendered is not None:
        same = sum(a == b for a, b in zip(rendered, ours))
        log(f"chat template: transformers' render equals tasks.render_chat for {same}/{len(ours)} prompts")
    with open(os.path.join(ref_dir, "heldout.jsonl"), "w") as f:
        for i, (e, p, pid, g, text) in enumerate(zip(problems, ours, prompt_ids, gens, texts)):
            row = e.to_json()
            row["prompt"] = p
            row["prompt_hf_rendered"] = rendered[i] if rendered else None
            row["prompt_ids"] = pid
            row["question_ids"] = tok.encode(e.question, add_special_tokens=False).ids
            row["response_ids"] = tok.encode(e.response, add_special_tokens=False).ids
            row["hf_greedy_ids"] = g
            row["hf_greedy_response"] = text
            f.write(json.dumps(row) + "\n")

    # HF fp32 logits on the CPU with eager attention, at every position of prompt + greedy answer.
    cpu = transformers.Qwen3_5MoeForCausalLM(copy.deepcopy(model.config)).float()
    cpu.load_state_dict({k: v.detach().float().cpu() for k, v in model.state_dict().items()})
    cpu.config._attn_implementation = "eager"
    if hasattr(cpu, "set_experts_implementation"):
        cpu.set_experts_implementation("eager")
    cpu.eval()
    picks = []
    for task in tasks.HELDOUT_COUNTS:  # two of each task
        picks += [i for i, e in enumerate(problems) if e.task == task][:2]
    seqs, offsets, blocks, off = [], [], [], 0
    eos_id = tok.token_to_id(tasks.IM_END)
    with torch.no_grad():
        for i in picks[:N_LOGIT_PROMPTS]:
            ids = prompt_ids[i] + gens[i] + [eos_id]
            logits = cpu(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
            blocks.append(logits)
            seqs.append({"index": i, "task": problems[i].task, "ids": ids, "prompt_len": len(prompt_ids[i]),
                         "offset": off})
            off += len(ids)
    np.save(os.path.join(ref_dir, "hf_logits.npy"), np.concatenate(blocks).astype(np.float32))
    import tokenizers
    ref = {"sequences": seqs, "vocab_size": model.config.vocab_size, "transformers": transformers.__version__,
           "torch": torch.__version__, "tokenizers": tokenizers.__version__, "training": figures}
    with open(os.path.join(ref_dir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


def cache_crosscheck(model, prompt_ids, gens, eos_id, pad_id, n=5):
    """HF generate (with its cache: recurrent DeltaNet steps) must agree with the no-cache greedy."""
    agree = 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(prompt_ids), max(1, len(prompt_ids) // n))[:n]:
            x = torch.tensor([prompt_ids[i]], device=next(model.parameters()).device)
            out = model.generate(x, max_new_tokens=len(gens[i]) + 1, do_sample=False, eos_token_id=eos_id,
                                 pad_token_id=pad_id)
            got = out[0, x.shape[1]:].tolist()
            if got and got[-1] == eos_id:
                got = got[:-1]
            agree += got == gens[i]
    log(f"HF generate with cache agrees with no-cache greedy on {agree}/{n} prompts")
    return agree


def post_training(model, tok, out_dir, problems, prompt_ids, figures, device, eos_id, pad_id, max_new):
    """Rounds to bf16, measures HF accuracy, writes the model folder and references."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    write_model_files(model, out_dir, eos_id, pad_id)  # first, so that nothing later can lose it
    acc, per, gens, texts = evaluate(model, tok, problems, prompt_ids, eos_id, pad_id, device, max_new,
                                     label="HF held-out (bf16 weights, greedy)")
    exact = sum(t == e.response for t, e in zip(texts, problems))
    figures.update({"hf_heldout_accuracy": acc, "hf_heldout_exact_responses": exact,
                    "hf_heldout_per_task": {t: f"{a}/{b}" for t, (a, b) in per.items()}})
    # The same problems as the second turn of a chat (what `petrel chat` sees).
    hist_stream = tasks.training_stream(4321, {e.key for e in problems})
    chat_prompts = []
    for e in problems:
        h = next(hist_stream)
        msgs = [{"role": "user", "content": h.question}, {"role": "assistant", "content": h.response},
                {"role": "user", "content": e.question}]
        chat_prompts.append(tok.encode(tasks.render_chat(msgs), add_special_tokens=False).ids)
    chat_acc = evaluate(model, tok, problems, chat_prompts, eos_id, pad_id, device, max_new,
                        label="HF held-out as 2nd chat turn")[0]
    figures["hf_heldout_accuracy_second_turn"] = chat_acc
    try:
        figures["hf_cache_agreement"] = f"{cache_crosscheck(model, prompt_ids, gens, eos_id, pad_id)}/5"
    except Exception as e:  # noqa: BLE001
        log(f"WARNING: cache cross-check failed: {type(e).__name__}: {e}")
    write_references(model, tok, out_dir, problems, prompt_ids, gens, texts, figures)
    return acc


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="model folder to write")
    ap.add_argument("--time-budget", type=float, default=270.0, help="seconds of training")
    ap.add_argument("--steps", type=int, default=0, help="train exactly this many steps instead")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--single", type=int, default=600_000, help="single-turn training examples")
    ap.add_argument("--multi", type=int, default=100_000, help="2-3 turn training chats")
    ap.add_argument("--init-from", help="continue from this model folder's weights and tokenizer")
    ap.add_argument("--no-smoke", action="store_true")
    args = ap.parse_args()

    t_start = time.time()
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    from tokenizers import Tokenizer
    os.makedirs(args.out, exist_ok=True)
    if args.init_from:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.abspath(args.init_from) != os.path.abspath(args.out):
                shutil.copy(os.path.join(args.init_from, name), os.path.join(args.out, name))
        tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    else:
        t0 = time.time()
        tok = train_tokenizer.train()
        train_tokenizer.write(tok, args.out)
        tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
        log(train_tokenizer.describe(tok))
        log(f"tokenizer trained in {time.time() - t0:.1f} s")
    pad_id, eos_id = tok.token_to_id(tasks.PAD), tok.token_to_id(tasks.IM_END)
    nl_ids = tok.encode("\n", add_special_tokens=False).ids
    assert len(nl_ids) == 1, nl_ids
    vocab = 64 * math.ceil(tok.get_vocab_size() / 64)

    problems = tasks.heldout()
    prompt_ids = [tok.encode(tasks.render_chat([{"role": "user", "content": e.question}]),
                             add_special_tokens=False).ids for e in problems]
    max_new = max(len(tok.encode(e.response, add_special_tokens=False).ids) for e in problems) + 8

    torch.manual_seed(SEED)
    model = transformers.Qwen3_5MoeForCausalLM(model_config(vocab, pad_id, eos_id)).float().to(device)
    if args.init_from:
        load_weights(model, os.path.join(args.init_from, "model.safetensors"))
    impl = pick_experts_implementation(model, device, vocab)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters ({2 * n_params / 2**20:.1f} MiB in bf16), vocab {vocab}, "
        f"experts implementation {impl}, attention {model.config._attn_implementation}")
    assert 2 * n_params < 16 * 2**20, "model.safetensors must stay under 16 MiB"
    rope = getattr(getattr(getattr(model, "model", None), "rotary_emb", None), "inv_freq", None)
    log(f"rotary dims used by HF: {2 * rope.numel() if rope is not None else '?'} of head_dim 64; "
        f"rope_parameters {model.config.rope_parameters}")

    if not args.no_smoke:  # the whole post-training path once, on the untrained model and a few problems
        t0 = time.time()
        smoke_dir = os.path.join(args.out, ".smoke")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            os.makedirs(smoke_dir, exist_ok=True)
            shutil.copy(os.path.join(args.out, name), os.path.join(smoke_dir, name))
        smoke = transformers.Qwen3_5MoeForCausalLM(copy.deepcopy(model.config)).float().to(device)
        smoke.load_state_dict(model.state_dict())
        if hasattr(smoke, "set_experts_implementation"):
            smoke.set_experts_implementation(impl)
        sel = list(range(0, 200, 10))
        post_training(smoke, tok, smoke_dir, [problems[i] for i in sel], [prompt_ids[i] for i in sel],
                      {"smoke": True}, device, eos_id, pad_id, 6)
        shutil.rmtree(smoke_dir)
        del smoke
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        log(f"smoke run of the post-training steps ok ({time.time() - t0:.1f} s)")

    single, multi, n_tok = build_training_data(tok, args.single, args.multi, pad_id, nl_ids[0], SEED)

    def eval_fn():
        return evaluate(model, tok, problems, prompt_ids, eos_id, pad_id, device, max_new)

    figures = train(model, single, multi, args, device, eval_fn)
    figures.update({"batch": args.batch, "lr": args.lr, "warmup": args.warmup, "time_budget": args.time_budget,
                    "single_examples": args.single, "multi_turn_chats": args.multi,
                    "training_tokens_in_set": n_tok, "init_from": args.init_from, "seed": SEED,
                    "experts_implementation": impl, "parameters": n_params,
                    "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"})
    acc = post_training(model, tok, args.out, problems, prompt_ids, figures, device, eos_id, pad_id, max_new)
    figures["wall_seconds_total"] = round(time.time() - t_start, 1)
    ref_path = os.path.join(args.out, "reference", "reference.json")
    with open(ref_path) as f:
        ref = json.load(f)
    ref["training"] = figures
    with open(ref_path, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    log("figures: " + json.dumps(figures))
    log(f"done in {time.time() - t_start:.1f} s; HF held-out accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
