"""Fine-tunes the MiniLM encoder on the training table (train/out/dataset.jsonl,
split "train" only) with low-rank adapters (LoRA), and writes the adapters as
a delta the Rust encoder adds to the pinned base weights at load.

Why adapters: the base weights come from a package registry by pinned version
and checksum; a full fine-tuned copy (91 MB) could be neither fetched nor
committed. Rank-r adapters on every dense layer of the six transformer layers
are ~0.3 M numbers, small enough to live beside heads.json.

The objective is the heads' own: per head, class-weighted binary
cross-entropy on the mean-pooled, L2-normalised embedding of the text's first
128 tokens (the served chunk), null labels and heads a source does not teach
(MODERATO_HEADS_NOT_TAUGHT, prepare.py) left out. The linear layer used
here is thrown away: train_heads.py fits the shipped heads on the adapted
embeddings as on the base ones. The checkpoints (--evals per epoch) are compared on the
validation half (any-category AUPRC of this throw-away head); nothing is
trained on it.

Usage (in an environment of train/requirements-finetune.txt; MODERATO_ENCODER_ADAPTER=OUT
train_heads.py then fits heads on it):
  python finetune_encoder.py OUT.safetensors [--rank 8] [--epochs 2] [--lr 1e-3]
      [--extra-weight 0.5] [--only-real]
--extra-weight adds the labelled real texts the heads leave out (Toxic Spans,
Davidson: train/out/ngram_extra.jsonl); --only-real keeps the sources real:*
alone. Neither helped the validation half (eval/ABLATION-real.md, 2026-11-27).
"""

import argparse
import json
import math
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from common import HEADS, ROOT, WORK
import eval_sets
from train_heads import taught_label

MINILM = ROOT / "models" / "minilm"
MAX_TOKENS = 128
SEED = 20261126
# Adapted dense layers of each transformer layer (safetensors names).
ADAPTED = [
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
]


class LoRALinear(torch.nn.Module):
    """y = x Wᵀ + b + (x Aᵀ) Bᵀ · scale, with W and b frozen."""

    def __init__(self, weight, bias, rank, alpha):
        super().__init__()
        out_f, in_f = weight.shape
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = torch.nn.Parameter(bias, requires_grad=False)
        self.a = torch.nn.Parameter(torch.empty(rank, in_f))
        torch.nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
        self.b = torch.nn.Parameter(torch.zeros(out_f, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.a), self.b) * self.scale


class Bert(torch.nn.Module):
    """BERT as all-MiniLM-L6-v2 has it (post-norm, erf GELU), with adapters."""

    def __init__(self, w, rank, alpha, layers=6, heads=12, eps=1e-12):
        super().__init__()
        frozen = lambda t: torch.nn.Parameter(t, requires_grad=False)  # noqa: E731
        self.word = frozen(w["embeddings.word_embeddings.weight"])
        self.pos = frozen(w["embeddings.position_embeddings.weight"])
        self.typ = frozen(w["embeddings.token_type_embeddings.weight"])
        self.ln_w = frozen(w["embeddings.LayerNorm.weight"])
        self.ln_b = frozen(w["embeddings.LayerNorm.bias"])
        self.heads, self.eps = heads, eps
        self.layers = torch.nn.ModuleList()
        for i in range(layers):
            p = f"encoder.layer.{i}."
            layer = torch.nn.Module()
            layer.lin = torch.nn.ModuleDict(
                {
                    name.replace(".", "_"): LoRALinear(w[p + name + ".weight"], w[p + name + ".bias"], rank, alpha)
                    for name in ADAPTED
                }
            )
            for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
                setattr(layer, ln.replace(".", "_") + "_w", frozen(w[p + ln + ".weight"]))
                setattr(layer, ln.replace(".", "_") + "_b", frozen(w[p + ln + ".bias"]))
            self.layers.append(layer)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, ids, mask):
        *_, x = self.states(ids, mask)
        return mean_pool(x, mask)

    def states(self, ids, mask):
        """The token states after the embeddings and after each layer."""
        n, t = ids.shape
        x = self.word[ids] + self.pos[:t][None] + self.typ[0][None, None]
        x = self.drop(F.layer_norm(x, (x.shape[-1],), self.ln_w, self.ln_b, self.eps))
        yield x
        bias = (1.0 - mask[:, None, None, :].float()) * -1e4
        d = x.shape[-1] // self.heads
        for layer in self.layers:
            lin = layer.lin
            split = lambda y: y.view(n, t, self.heads, d).transpose(1, 2)  # noqa: E731
            q, k, v = (split(lin[f"attention_self_{m}"](x)) for m in ("query", "key", "value"))
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.1 if self.training else 0.0)
            att = att.transpose(1, 2).reshape(n, t, -1)
            x = F.layer_norm(
                x + self.drop(lin["attention_output_dense"](att)),
                (x.shape[-1],),
                layer.attention_output_LayerNorm_w,
                layer.attention_output_LayerNorm_b,
                self.eps,
            )
            h = lin["output_dense"](F.gelu(lin["intermediate_dense"](x)))
            x = F.layer_norm(x + self.drop(h), (x.shape[-1],), layer.output_LayerNorm_w, layer.output_LayerNorm_b, self.eps)
            yield x

    def delta(self):
        """The adapters by the name of the base weight they adapt: `.lora_a`
        (rank × in) and `.lora_b` (out × rank, the scale folded in), in
        half precision: half the file, and far finer than the 8-bit blocks
        the merged weights are served in."""
        out = {}
        for i, layer in enumerate(self.layers):
            for name in ADAPTED:
                lin = layer.lin[name.replace(".", "_")]
                key = f"encoder.layer.{i}.{name}.weight"
                out[key + ".lora_a"] = lin.a.detach().half().contiguous()
                out[key + ".lora_b"] = (lin.b.detach() * lin.scale).half().contiguous()
        return out


def mean_pool(states, mask):
    """The L2-normalised mean of the token states over real tokens (as served)."""
    m = mask[..., None].float()
    return F.normalize((states * m).sum(1) / m.sum(1).clamp(min=1.0), dim=-1)


def tokenizer():
    tok = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def encode(tok, texts):
    """Token ids of each text's first chunk: [CLS] … [SEP], at most MAX_TOKENS."""
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    out = []
    for e in tok.encode_batch(texts, add_special_tokens=False):
        out.append([cls] + e.ids[: MAX_TOKENS - 2] + [sep])
    return out


def batches(order, lens, size):
    """Batches of similar lengths (little padding), in shuffled order."""
    chunks = [order[i : i + size * 50] for i in range(0, len(order), size * 50)]
    out = []
    for c in chunks:
        c = sorted(c, key=lambda i: lens[i])
        out += [c[i : i + size] for i in range(0, len(c), size)]
    random.shuffle(out)
    return out


def pad(seqs):
    t = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), t, dtype=torch.long)
    mask = torch.zeros(len(seqs), t, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


@torch.no_grad()
def embed(model, seqs, size=64):
    model.eval()
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = torch.zeros(len(seqs), 384)
    for i in range(0, len(order), size):
        idx = order[i : i + size]
        ids, mask = pad([seqs[j] for j in idx])
        out[idx] = model(ids, mask)
    model.train()
    return out


def validation_auprc(model, head, val_seqs, val_labels):
    from sklearn.metrics import average_precision_score

    e = embed(model, val_seqs)
    with torch.no_grad():
        p = torch.sigmoid(head(e * 10)).numpy()
    cats = [h for h in HEADS if h != "minor"]
    any_score = p[:, [HEADS.index(c) for c in cats]].max(1)
    y = np.array([v if v is not None else -1 for v in val_labels["any"]])
    keep = y >= 0
    result = {"any": average_precision_score(y[keep], any_score[keep])}
    per = []
    for c, ys in val_labels.items():
        if c in ("any",) or c not in HEADS:
            continue
        y = np.array([v if v is not None else -1 for v in ys])
        keep = y >= 0
        if y[keep].sum() >= 5:
            per.append(average_precision_score(y[keep], p[keep, HEADS.index(c)]))
    result["per_category"] = float(np.mean(per))
    return result


def taught(row, head):
    """The row's label for `head` as the heads learn it (-1: unknown, or a
    head its source does not teach, MODERATO_HEADS_NOT_TAUGHT)."""
    v = taught_label(row, head)
    return -1 if np.isnan(v) else v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--limit", type=int, default=0, help="rows (a quick timing run)")
    ap.add_argument("--real-weight", type=float, default=1.0, help="weight of the real texts (sources real:*)")
    ap.add_argument("--evals", type=int, default=4, help="validation checks per epoch")
    ap.add_argument(
        "--extra-weight",
        type=float,
        default=0.0,
        help="also train on the labelled real texts the heads leave out (train/out/ngram_extra.jsonl: Toxic Spans, Davidson), at this weight",
    )
    ap.add_argument("--only-real", action="store_true", help="train on the real texts labelled by our definitions (sources real:*) alone")
    args = ap.parse_args()
    random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(2)

    rows = [json.loads(line) for line in open(WORK / "dataset.jsonl")]
    rows = [r for r in rows if r["split"] == "train"]
    if args.extra_weight > 0:
        # Civil Comments and tweets labelled by our definitions: the register of
        # the validation half, which the heads' rows lack. The heads do not learn
        # their labels (prepare.py); the encoder may. prepare.py already dropped
        # those that copy an evaluation text or a row of dataset.jsonl.
        extra = [json.loads(line) for line in open(WORK / "ngram_extra.jsonl")]
        for r in extra:
            r["weight"] = args.extra_weight
        rows += extra
    if args.only_real:
        rows = [r for r in rows if r["source"].startswith("real:")]
    if args.limit:
        random.shuffle(rows)
        rows = rows[: args.limit]
    tok = tokenizer()
    seqs = encode(tok, [r["text"] for r in rows])
    lens = [len(s) for s in seqs]
    y = torch.tensor([[taught(r, h) for h in HEADS] for r in rows], dtype=torch.float)
    weight = torch.tensor([r.get("weight", 1.0) * (args.real_weight if r["source"].startswith("real:") else 1.0) for r in rows])
    known = y >= 0
    pos = ((y == 1) & known).sum(0).float()
    neg = ((y == 0) & known).sum(0).float()
    pos_weight = (neg / pos.clamp(min=1)).sqrt()
    print(f"finetune: {len(rows)} rows, mean {np.mean(lens):.0f} tokens; pos_weight {pos_weight.numpy().round(1)}", flush=True)

    val_texts, val_labels = eval_sets.validation()
    val_seqs = encode(tok, val_texts)

    model = Bert(load_file(str(MINILM / "model.safetensors")), args.rank, args.alpha)
    head = torch.nn.Linear(384, len(HEADS))
    adapters = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        [{"params": adapters, "lr": args.lr, "weight_decay": 0.0}, {"params": head.parameters(), "lr": args.lr * 3, "weight_decay": 1e-4}]
    )
    steps_per_epoch = math.ceil(len(rows) / args.batch)
    total = int(steps_per_epoch * args.epochs)
    warm = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * max(0.0, (total - s) / total))
    print(f"finetune: {sum(p.numel() for p in adapters)} adapter numbers; {total} steps", flush=True)

    every = max(1, steps_per_epoch // args.evals)
    step, start, best = 0, time.time(), None
    order = list(range(len(rows)))
    while step < total:
        for idx in batches(order[:], lens, args.batch):
            if step >= total:
                break
            ids, mask = pad([seqs[i] for i in idx])
            logits = head(model(ids, mask) * 10)
            yy, kk = y[idx], known[idx]
            loss = F.binary_cross_entropy_with_logits(logits, yy.clamp(min=0), pos_weight=pos_weight, reduction="none")
            loss = (loss * kk * weight[idx, None]).sum() / kk.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % 50 == 0:
                print(f"step {step}/{total} loss {loss.item():.4f} {time.time() - start:.0f} s", flush=True)
            if step % every == 0 or step == total:
                v = validation_auprc(model, head, val_seqs, val_labels)
                print(f"step {step} epoch {step / steps_per_epoch:.2f}: validation any {v['any']:.4f} per-category {v['per_category']:.4f}", flush=True)
                save_file(model.delta(), f"{args.out}.step{step}")
                if best is None or v["any"] > best[0]:
                    best = (v["any"], step)
    save_file(model.delta(), args.out)
    print(f"finetune: done in {time.time() - start:.0f} s; best validation any {best[0]:.4f} at step {best[1]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
