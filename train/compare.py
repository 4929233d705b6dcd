"""Paired comparison of two heads files on the same texts: any-category and
mean per-category AUPRC, and flagged F1 / FPR / recall at each file's own
thresholds, with 95 % intervals of the differences from 500 bootstrap
resamples of the texts (as eval/ABLATION-chunks.md).

Usage: python compare.py BEFORE.json[:NGRAMS.bin][@EXAMPLES] AFTER.json[:NGRAMS.bin][@EXAMPLES] [set,set,...]
Sets default to the validation half, ToxicChat and the development set.
Each heads file is scored with the n-gram model it names (by sha256): the
shipped `assets/text-model/ngrams.bin` unless a path follows the colon; a
heads file that names another model is refused rather than scored with the
wrong one (the examples read the model from MODERATO_NGRAM_MODEL).
A directory after `@` holds the `embed`, `lexical_features` and `embed_e5`
binaries of another build to score that side with (its embeddings are
stored apart from this build's): heads from before a change to how
the serving code computes their features (the n-gram windows, say) are then
measured as they were served, not with today's code."""

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
from sklearn.metrics import average_precision_score

from common import CATEGORIES, NGRAM_MODEL_PATH, _sha256, apply_heads, decide, e5_if_needed, embed_texts, lexical_features
import eval_sets
from evaluate import sample_indices

RESAMPLES = 500


def load_heads(arg):
    """A heads file, the n-gram model and the examples directory to score it
    with (None: this build's), from `HEADS.json[:NGRAMS.bin][@EXAMPLES]`."""
    arg, _, examples = arg.partition("@")
    heads_path, _, ngrams = arg.partition(":")
    heads = json.loads(Path(heads_path).read_text())
    ngrams = Path(ngrams) if ngrams else NGRAM_MODEL_PATH
    named = heads.get("ngram_model")
    if named and _sha256(ngrams) != named:
        sys.exit(f"compare: {heads_path} names n-gram model {named}, not {ngrams}'s; pass {heads_path}:PATH")
    if examples and not (Path(examples) / "lexical_features").exists():
        sys.exit(f"compare: {examples} holds no lexical_features binary")
    return heads, ngrams, examples or None


THIS_BUILD = os.environ.get("MODERATO_EXAMPLES_DIR")


def scores(heads, texts, name, ngrams=NGRAM_MODEL_PATH, examples=None):
    os.environ["MODERATO_NGRAM_MODEL"] = str(ngrams)  # read by the examples embed_texts and lexical_features run
    # A side with its own build keeps its own embeddings (common.store_tag).
    if examples:
        os.environ["MODERATO_STORE_TAG"] = "at-" + hashlib.sha256(str(Path(examples).resolve()).encode()).hexdigest()[:12]
    else:
        os.environ.pop("MODERATO_STORE_TAG", None)
    examples = examples or THIS_BUILD  # read by common.examples_dir
    if examples:
        os.environ["MODERATO_EXAMPLES_DIR"] = str(examples)
    else:
        os.environ.pop("MODERATO_EXAMPLES_DIR", None)
    cfg = dict(heads, input="raw")
    vecs, idx = embed_texts(texts, cfg, name, namespace="wide")
    S = apply_heads(cfg, vecs, idx, len(texts), lexical_features(texts), e5_if_needed(cfg, texts, name))
    flags = decide(S, np.array([heads["thresholds"][c] for c in CATEGORIES]), heads.get("parents", []))
    return S, flags


def figures(S, flags, labels, rows):
    """any AUPRC, mean per-category AUPRC, and any-category F1/FPR/recall of the flags, over `rows`."""
    out = {}
    # A set labelled in one category only (ethos_violence) has no "any".
    ya = np.array([labels["any"][i] for i in rows] if "any" in labels else [np.nan] * len(rows), dtype=float)
    known = ~np.isnan(ya)
    y, s, f = ya[known].astype(int), S[rows][known].max(axis=1), flags[rows][known].any(axis=1)
    out["any"] = average_precision_score(y, s) if 0 < y.sum() < len(y) else np.nan
    tp, fp, fn = int((f & (y == 1)).sum()), int((f & (y == 0)).sum()), int((~f & (y == 1)).sum())
    out["f1"] = 2 * tp / max(2 * tp + fp + fn, 1)
    out["fpr"] = fp / max(int((y == 0).sum()), 1)
    out["recall"] = tp / max(tp + fn, 1)
    per = []
    for c, ys in labels.items():
        if c == "any":
            continue
        yc = np.array([ys[i] for i in rows], dtype=float)
        k = ~np.isnan(yc)
        if 0 < yc[k].sum() < k.sum():
            per.append(average_precision_score(yc[k].astype(int), S[rows][k][:, CATEGORIES.index(c)]))
    out["per_cat"] = float(np.mean(per)) if per else np.nan
    return out


def sampled_set(sets, name):
    """A set's fixed evaluation sample (evaluate.py's): its texts, and its
    labels with unknown as NaN."""
    _, texts, labels = sets[name]
    keep = sample_indices(name, len(texts))
    texts = [texts[i] for i in keep]
    return texts, {c: [np.nan if v[i] is None else v[i] for i in keep] for c, v in labels.items()}


def main():
    (before, before_ngrams, before_bin), (after, after_ngrams, after_bin) = load_heads(sys.argv[1]), load_heads(sys.argv[2])
    names = sys.argv[3].split(",") if len(sys.argv) > 3 else ["validation", "toxicchat", "dev"]
    sets = eval_sets.load_all()
    rng = np.random.default_rng(20261125)
    print(f"| set (texts) | figure | {before['version']} | {after['version']} | difference (95 % interval) |")
    print("|---|---|---|---|---|")
    for name in names:
        texts, labels = sampled_set(sets, name)
        Sb, Fb = scores(before, texts, name, before_ngrams, before_bin)
        Sa, Fa = scores(after, texts, name, after_ngrams, after_bin)
        rows = np.arange(len(texts))
        b, a = figures(Sb, Fb, labels, rows), figures(Sa, Fa, labels, rows)
        diffs = {k: [] for k in a}
        for _ in range(RESAMPLES):
            r = rng.integers(0, len(texts), len(texts))
            bb, aa = figures(Sb, Fb, labels, r), figures(Sa, Fa, labels, r)
            for k in a:
                diffs[k].append(aa[k] - bb[k])
        for k in ("any", "per_cat", "f1", "fpr", "recall"):
            lo, hi = np.nanpercentile(diffs[k], [2.5, 97.5])
            print(f"| {name} ({len(texts)}) | {k} | {b[k]:.3f} | {a[k]:.3f} | {a[k] - b[k]:+.3f} ({lo:+.3f}..{hi:+.3f}) |")


if __name__ == "__main__":
    main()
