"""Measures whether the encoder's earlier layers carry what the last one
lacks, before anything is built for it: per-head logistic regressions on
mean-pooled layer outputs of the first 128 tokens (fp32, torch), fitted on
the training split of train/out/dataset.jsonl, scored on the validation half
and ToxicChat. A proxy (no lexical features, no n-gram layer, no chunks):
only the difference between feature sets is read, never the level.

Usage (in the environment of requirements-finetune.txt):
  python layers_proxy.py
"""

import json
import sys

import numpy as np
import torch
from safetensors.torch import load_file
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score

import eval_sets
from common import HEADS, WORK
from finetune_encoder import MINILM, Bert, encode, mean_pool, pad, taught, tokenizer

CACHE = WORK / "layers_proxy.npz"


@torch.no_grad()
def layer_means(model, seqs, size=64):
    """(n, 7, 384): the mean over real tokens of the embedding output and of
    each of the six layers' outputs, each L2-normalised."""
    model.eval()
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = np.zeros((len(seqs), 7, 384), dtype=np.float32)
    for s in range(0, len(order), size):
        idx = order[s : s + size]
        ids, mask = pad([seqs[j] for j in idx])
        for li, st in enumerate(model.states(ids, mask)):
            out[idx, li] = mean_pool(st, mask).numpy()
    return out


def embeddings():
    if CACHE.exists():
        z = np.load(CACHE)
        return z["train"], z["y"], z["w"], z["val"], z["val_y"], z["tc"], z["tc_y"]
    torch.set_num_threads(2)
    rows = [json.loads(line) for line in open(WORK / "dataset.jsonl")]
    rows = [r for r in rows if r["split"] == "train"]
    tok = tokenizer()
    model = Bert(load_file(str(MINILM / "model.safetensors")), 1, 1)
    y = np.array([[taught(r, h) for h in HEADS] for r in rows], dtype=np.int8)
    w = np.array([r.get("weight", 1.0) for r in rows], dtype=np.float32)
    print(f"proxy: embedding {len(rows)} training rows", file=sys.stderr, flush=True)
    train = layer_means(model, encode(tok, [r["text"] for r in rows]))
    vt, vl = eval_sets.validation()
    val = layer_means(model, encode(tok, vt))
    val_y = np.array([[v if v is not None else -1 for v in vl.get(h, [None] * len(vt))] for h in HEADS + ["any"]], dtype=np.int8).T
    tt, tl = eval_sets.toxicchat()
    tc = layer_means(model, encode(tok, tt))
    tc_y = np.array([v if v is not None else -1 for v in tl["any"]], dtype=np.int8)
    np.savez(CACHE, train=train, y=y, w=w, val=val, val_y=val_y, tc=tc, tc_y=tc_y)
    return train, y, w, val, val_y, tc, tc_y


def features(E, spec):
    return np.concatenate([E[:, i] for i in spec], axis=1) if isinstance(spec, tuple) else E[:, list(spec["mean"])].mean(1)


def any_scores(X, y, w, Xs, C):
    """Per-category probabilities of balanced logistic regressions; the
    any-category score is their largest (the minor signal left out)."""
    cats = [h for h in HEADS if h != "minor"]
    outs = [np.zeros((len(Z), len(HEADS))) for Z in Xs]
    for c in cats:
        j = HEADS.index(c)
        known = y[:, j] >= 0
        lr = LogisticRegression(C=C, class_weight="balanced", max_iter=2000)
        lr.fit(X[known], y[known, j], sample_weight=w[known])
        for o, Z in zip(outs, Xs):
            o[:, j] = lr.predict_proba(Z)[:, 1]
    return [o[:, [HEADS.index(c) for c in cats]].max(1) for o in outs], outs


def paired(y, a, b, n=500, seed=0):
    rng = np.random.default_rng(seed)
    keep = y >= 0
    y, a, b = y[keep], a[keep], b[keep]
    d = []
    for _ in range(n):
        i = rng.integers(0, len(y), len(y))
        if y[i].sum() == 0:
            continue
        d.append(average_precision_score(y[i], b[i]) - average_precision_score(y[i], a[i]))
    return np.percentile(d, [2.5, 97.5])


def main():
    train, y, w, val, val_y, tc, tc_y = embeddings()
    specs = {
        "L6": (6,),
        "L6+L4": (6, 4),
        "L6+L3": (6, 3),
        "L6+L2": (6, 2),
        "L6+L4+L2": (6, 4, 2),
        "mean L1-6": {"mean": range(1, 7)},
        "mean L4-6": {"mean": range(4, 7)},
    }
    C = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    base = None
    for name, spec in specs.items():
        (va, ta), (vp, _) = any_scores(features(train, spec), y, w, [features(val, spec), features(tc, spec)], C)
        keep = val_y[:, -1] >= 0
        v_any = average_precision_score(val_y[keep, -1], va[keep])
        t_any = average_precision_score(tc_y[tc_y >= 0], ta[tc_y >= 0])
        per = []
        for j, h in enumerate(HEADS):
            k = val_y[:, j] >= 0
            if h != "minor" and val_y[k, j].sum() >= 5:
                per.append(average_precision_score(val_y[k, j], vp[k, j]))
        line = f"{name:12s} validation any {v_any:.3f} per-category {np.mean(per):.3f} toxicchat any {t_any:.3f}"
        if base is None:
            base = (va, ta)
        else:
            lo, hi = paired(val_y[:, -1], base[0], va)
            tlo, thi = paired(tc_y, base[1], ta)
            line += f"  diff val [{lo:+.3f},{hi:+.3f}] tc [{tlo:+.3f},{thi:+.3f}]"
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
