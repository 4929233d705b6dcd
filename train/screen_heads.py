"""Screens heads with a hidden layer against linear ones on the validation
half: both fitted by train_heads.fit_head on the same rows, features and
served design, both Platt-calibrated on the calibration split's served
scores, both scored by common.apply_heads as served (strongest chunk),
composed as in serving.

Usage (after scripts/train-text-model.sh has filled train/out/):
  ../.venv/bin/python screen_heads.py
  MODERATO_SCREEN_HEADS=self-harm MODERATO_SCREEN_SETS=validation,twitter_suicidal \
    MODERATO_SCREEN_MLP='{"units": 64, "alpha": 10, "epochs": 10, "seed": 7}' \
    ../.venv/bin/python screen_heads.py
MODERATO_SCREEN_BLEND=1 scores the mean of the two calibrated probabilities.
Prints per set the any-category and per-category AUPRC of each and the
paired bootstrap interval of the any-category difference. Measures only;
writes nothing the shipped model reads (eval/ABLATION-real.md, heads .15).
The sets other than the validation half are for measuring, never for
choosing a candidate's settings."""

import json
import os
import sys

import numpy as np
from sklearn.metrics import average_precision_score

import eval_sets
import train_heads as th
from common import CATEGORIES, HEADS, apply_heads, embed_texts, lexical_features

# MODERATO_SCREEN_MLP (JSON) overrides train_heads.fit_hidden's settings:
# {"units": 128, "alpha": 0.01, "epochs": 30, "seed": ...}
HIDDEN_SETTINGS = json.loads(os.environ.get("MODERATO_SCREEN_MLP", "{}"))
RESAMPLES = 500


def set_features(name):
    """Chunk embeddings, their owners, lexical features and labels of an
    evaluation set, raw view (as train_heads.validation_scores measures)."""
    texts, labels = eval_sets.validation() if name == "validation" else eval_sets.SETS[name][1]()
    vecs, idx = embed_texts(texts, dict(th.config(), input="raw"), name, namespace="wide")
    return vecs, idx, lexical_features(texts), labels


def auprc(y, s):
    known = ~np.isnan(y)
    return average_precision_score(y[known], s[known]) if known.any() and y[known].sum() > 0 else np.nan


# MODERATO_SCREEN_HEADS: the heads that get the candidate model (comma-separated; default all),
# the rest keep the linear one. MODERATO_SCREEN_SETS: the sets scored (default validation).
SCREEN_HEADS = set(filter(None, os.environ.get("MODERATO_SCREEN_HEADS", ",".join(HEADS)).split(",")))
SCREEN_SETS = os.environ.get("MODERATO_SCREEN_SETS", "validation").split(",")


def fitted_heads():
    """Two heads files as train_heads fits them (thresholds aside): every
    head linear, and the screened heads with a hidden layer."""
    rows, X, lex, chunks = th.load_rows()
    keep = th.drop_near_duplicates(rows) & th.drop_embedding_near_copies(rows, X)
    rows = [r for r, k in zip(rows, keep) if k]
    X, chunks = X[keep], chunks.keep(keep)
    split = np.array([r["split"] for r in rows])
    plain = th.without_ngrams(X, chunks)
    linear, candidate = th.config(), th.config()
    for h in HEADS:
        X_h, chunks_h = (X, chunks) if h in th.NGRAM_HEADS else plain
        lab = th.head_labels(rows, h)
        known = ~np.isnan(lab)
        tr = np.where(known & (split == "train"))[0]
        cal = np.where(known & (split == "calib"))[0]
        ycal = lab[cal].astype(int)
        linear["heads"][h], _, ap, _ = th.fit_head(X_h, chunks_h, tr, lab[tr], cal, ycal)
        candidate["heads"][h], ap_c = linear["heads"][h], ap
        if h in SCREEN_HEADS:
            candidate["heads"][h], _, ap_c, _ = th.fit_head(X_h, chunks_h, tr, lab[tr], cal, ycal, hidden=True,
                                                          **HIDDEN_SETTINGS)
        print(f"screen: {h:24s} calib AUPRC linear {ap:.3f} hidden {ap_c:.3f}", file=sys.stderr)
    return {"linear": linear, "hidden": candidate}


def column(y):
    return np.array([np.nan if v is None else v for v in y], dtype=float)


def report(name, heads):
    vecs, idx, lex, labels = set_features(name)
    S = {m: apply_heads(h, vecs, idx, len(lex), lex) for m, h in heads.items()}
    if os.environ.get("MODERATO_SCREEN_BLEND") == "1":  # the mean of the two calibrated probabilities
        S["hidden"] = 0.5 * (S["hidden"] + S["linear"])
    print(f"== {name} ({len(lex)} texts)")
    print(f"{'category':24s} {'linear':>8s} {'hidden':>8s}")
    per = {m: [] for m in S}
    for c in (c for c in CATEGORIES if c in labels):
        y = column(labels[c])
        a = {m: auprc(y, S[m][:, CATEGORIES.index(c)]) for m in S}
        for m in S:
            per[m].append(a[m])
        print(f"{c:24s} {a['linear']:8.3f} {a['hidden']:8.3f}")
    if per["linear"]:
        print(f"{'mean per-category':24s} {np.nanmean(per['linear']):8.3f} {np.nanmean(per['hidden']):8.3f}")
    if "any" in labels:
        y_any = column(labels["any"])
        any_s = {m: S[m].max(axis=1) for m in S}
        print(f"{'any':24s} {auprc(y_any, any_s['linear']):8.3f} {auprc(y_any, any_s['hidden']):8.3f}")
        lo, mid, hi = paired_difference(y_any, any_s["hidden"], any_s["linear"])
        print(f"any-category difference hidden - linear: {mid:+.3f} ({lo:+.3f}..{hi:+.3f})")


def paired_difference(y, a, b):
    rng = np.random.default_rng(0)
    idx = np.where(~np.isnan(y))[0]
    diffs = []
    for _ in range(RESAMPLES):
        s = rng.choice(idx, len(idx))
        if 0 < y[s].sum() < len(s):
            diffs.append(average_precision_score(y[s], a[s]) - average_precision_score(y[s], b[s]))
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return lo, float(np.mean(diffs)), hi


def main():
    heads = fitted_heads()
    for name in SCREEN_SETS:
        report(name, heads)


if __name__ == "__main__":
    main()
