#!/usr/bin/env python3
"""Trains a multi-token prediction (MTP) head for petrel-tiny on its frozen trunk.

Runs on a CUDA machine with torch, transformers 5.x, tokenizers, safetensors and numpy:

    python3 tools/tiny/train_mtp.py --model models/petrel-tiny --time-budget 120

The head is Qwen3.5's (docs: model-spec section 5): e = norm(embed(x[t+1])), hh = norm(h_t) with
h_t the trunk's hidden state after its final norm, u = fc([e | hh]), one full-attention decoder
layer with its own MoE, d = norm(u), logits = lm_head(d) predicting x[t+2]. The decoder layer
starts as a copy of the trunk's last full-attention layer. Only the head trains (AdamW, the loss on
answer tokens, the same task data as train.py); the trunk's tensors are written back bit for bit,
so every reference of the trunk still holds. Writes into --model:
  model.safetensors  the trunk's tensors as they were, plus mtp.* (bf16, experts fused);
  config.json        plus mtp_num_hidden_layers: 1, mtp_use_dedicated_embeddings: false;
  reference/mtp.json the head's training figures and, on the 200 held-out problems answered by the
                     trunk's greedy decoding, how often the head's draft (one token ahead) equals the
                     trunk's greedy token (HF, fp32, bf16-rounded weights).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402
import train  # noqa: E402

log = train.log


class MtpHead(torch.nn.Module):
    """The mtp.* module; its state_dict keys are the checkpoint's names without the mtp. prefix."""

    def __init__(self, trunk):
        super().__init__()
        c = trunk.config
        norm_cls = type(trunk.model.norm)  # the zero-centred RMSNorm (1 + w) of the trunk
        self.pre_fc_norm_embedding = norm_cls(c.hidden_size, eps=c.rms_norm_eps)
        self.pre_fc_norm_hidden = norm_cls(c.hidden_size, eps=c.rms_norm_eps)
        self.fc = torch.nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        last_full = max(i for i, t in enumerate(c.layer_types) if t == "full_attention")
        layer = type(trunk.model.layers[last_full])(c, last_full)
        layer.load_state_dict(trunk.model.layers[last_full].state_dict())
        self.layers = torch.nn.ModuleList([layer])
        self.norm = norm_cls(c.hidden_size, eps=c.rms_norm_eps)
        torch.nn.init.normal_(self.fc.weight, std=c.initializer_range)

    def forward(self, emb_next, hidden, position_embeddings):
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(emb_next), self.pre_fc_norm_hidden(hidden)], dim=-1))
        out = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(out[0] if isinstance(out, tuple) else out)


class TrunkView:
    """The frozen trunk's final hidden states, input embeddings and rotary tables of a batch."""

    def __init__(self, trunk):
        self.trunk = trunk
        full = next(i for i, t in enumerate(trunk.config.layer_types) if t == "full_attention")
        self.rope = None
        trunk.model.layers[full].register_forward_pre_hook(self._grab_rope, with_kwargs=True)

    def _grab_rope(self, module, args, kwargs):
        self.rope = kwargs["position_embeddings"] if "position_embeddings" in kwargs else args[1]

    @torch.no_grad()
    def __call__(self, x):
        hidden = self.trunk.model(input_ids=x, use_cache=False).last_hidden_state  # after the final norm
        emb = self.trunk.model.embed_tokens(x)
        cos, sin = self.rope
        # The head pairs h_t with x[t+1] at position t: the first T-1 positions' tables.
        return hidden[:, :-1], emb[:, 1:], (cos[:, :-1], sin[:, :-1])


def mtp_logits(trunk, view, head, x):
    hidden, emb_next, rope = view(x)
    return trunk.lm_head(head(emb_next, hidden, rope))  # row t predicts x[t+2]


def train_head(trunk, view, head, single, multi, args, device):
    s_ids, s_mask = single[0].to(device), single[1].to(device)
    m_ids, m_mask = multi[0].to(device), multi[1].to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.05)
    gen = torch.Generator(device=device).manual_seed(train.SEED)
    head.train()
    step, train_s, ema = 0, 0.0, None
    while train_s < args.time_budget:
        t0 = time.time()
        lr = train.lr_at(step, train_s / args.time_budget, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x, m = train.draw_batch(step, (s_ids, s_mask), (m_ids, m_mask), args.batch, gen)
        logits = mtp_logits(trunk, view, head, x)[:, :-1]
        sel = m[:, 2:]
        loss = F.cross_entropy(logits[sel].float(), x[:, 2:][sel])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        ema = float(loss) if ema is None else 0.98 * ema + 0.02 * float(loss)
        step += 1
        train_s += time.time() - t0
        if step % 100 == 0:
            log(f"step {step:5d}  loss {float(loss):.4f} (ema {ema:.4f})  lr {lr:.2e}  {train_s:6.1f} s")
    log(f"trained the head {step} steps in {train_s:.1f} s; final loss ema {ema:.4f}")
    return {"steps": step, "train_seconds": round(train_s, 1), "final_loss_ema": round(ema, 5)}


@torch.no_grad()
def draft_agreement(trunk, view, head, prompt_ids, gens, eos_id, device):
    """Over every answer position of the trunk's greedy answers: how often the head's argmax equals
    the token the trunk chose next-but-one."""
    head.eval()
    right = total = 0
    per_seq = []
    for p, g in zip(prompt_ids, gens):
        ids = p + g + [eos_id]
        x = torch.tensor([ids], device=device)
        drafts = mtp_logits(trunk, view, head, x)[0].argmax(-1).tolist()  # drafts[t] for ids[t+2]
        hits = [drafts[t] == ids[t + 2] for t in range(len(p) - 2, len(ids) - 2)]
        right += sum(hits)
        total += len(hits)
        per_seq.append(sum(hits) / max(1, len(hits)))
    return right / total, float(np.mean(per_seq))


def mtp_tensors(head):
    """mtp.* in the released layout, bf16."""
    wrapper = torch.nn.Module()
    wrapper.mtp = head
    return {k: v for k, v in train.fused_state_dict(wrapper, torch.bfloat16).items() if k.startswith("mtp.")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the trained petrel-tiny folder, updated in place")
    ap.add_argument("--time-budget", type=float, default=120.0, help="seconds of training")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--single", type=int, default=600_000)
    ap.add_argument("--multi", type=int, default=100_000)
    args = ap.parse_args()

    t_start = time.time()
    torch.manual_seed(train.SEED)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    pad_id, eos_id = tok.token_to_id(tasks.PAD), tok.token_to_id(tasks.IM_END)
    with open(os.path.join(args.model, "config.json")) as f:
        config_json = json.load(f)
    path = os.path.join(args.model, "model.safetensors")
    trunk_tensors = {k: v for k, v in load_file(path).items() if not k.startswith("mtp.")}

    config = transformers.Qwen3_5MoeTextConfig(**{k: v for k, v in config_json.items()
                                                  if k not in ("architectures", "model_type", "dtype",
                                                               "transformers_version")})
    config._attn_implementation = "sdpa"  # causal without a mask, for the head's layer too
    trunk = transformers.Qwen3_5MoeForCausalLM(config).float().to(device)
    train.load_weights(trunk, path)
    trunk.eval()
    for p in trunk.parameters():
        p.requires_grad_(False)
    view = TrunkView(trunk)
    head = MtpHead(trunk).float().to(device)
    log(f"head: {sum(p.numel() for p in head.parameters()) / 1e6:.2f}M parameters")

    nl_ids = tok.encode("\n", add_special_tokens=False).ids
    single, multi, _ = train.build_training_data(tok, args.single, args.multi, pad_id, nl_ids[0], train.SEED + 7)
    figures = train_head(trunk, view, head, single, multi, args, device)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(p.to(torch.bfloat16).float())

    problems = tasks.heldout()
    prompt_ids = [tok.encode(tasks.render_chat([{"role": "user", "content": e.question}]),
                             add_special_tokens=False).ids for e in problems]
    max_new = max(len(tok.encode(e.response, add_special_tokens=False).ids) for e in problems) + 8
    gens = train.greedy_batch(trunk, prompt_ids, max_new, eos_id, pad_id, device)
    rate, mean_seq = draft_agreement(trunk, view, head, prompt_ids, gens, eos_id, device)
    log(f"held-out: the head's draft equals the trunk's greedy token at {100 * rate:.1f}% of answer positions "
        f"(mean per answer {100 * mean_seq:.1f}%)")
    figures.update({"heldout_draft_agreement": round(rate, 4), "heldout_draft_agreement_mean_per_answer":
                    round(mean_seq, 4), "batch": args.batch, "lr": args.lr, "time_budget": args.time_budget,
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "wall_seconds_total": round(time.time() - t_start, 1)})

    tensors = dict(trunk_tensors)
    tensors.update(mtp_tensors(head))
    save_file(tensors, path, metadata={"format": "pt"})
    config_json["mtp_num_hidden_layers"] = 1
    config_json["mtp_use_dedicated_embeddings"] = False
    with open(os.path.join(args.model, "config.json"), "w") as f:
        json.dump(config_json, f, indent=2, sort_keys=True)
        f.write("\n")
    os.makedirs(os.path.join(args.model, "reference"), exist_ok=True)
    with open(os.path.join(args.model, "reference", "mtp.json"), "w") as f:
        json.dump(figures, f, indent=1)
        f.write("\n")
    log("figures: " + json.dumps(figures))


if __name__ == "__main__":
    main()
