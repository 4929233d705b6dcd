"""Trains the n-gram model (src/moderation/text/ngrams.rs) whose logits the
heads read beside the embedding, and the out-of-fold logits the heads are
trained on.

Input: train/out/dataset.jsonl (the heads' rows) and train/out/ngram_extra.jsonl
(labelled real texts only this model learns from), both from prepare.py.
Terms are counted by the Rust `ngram_terms` example, the code that serves.
Output:
  assets/text-model/ngrams.bin  the model, fitted on every row (the format is
                                in ngrams.rs)
  train/out/ngram_oof.npy       per dataset row, the logits (strongest
                                window's, as served) of a model that did not
                                see it (5 folds, common.FOLDS_BY_TEXT; the
                                extra rows are in
                                every fold's training), which train_heads.py
                                puts in place of the shipped model's, so the
                                heads learn how far to trust the n-gram model
                                on texts it has not learnt by heart.

Usage: python train_ngrams.py"""

import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold

from common import HEADS, NGRAM_MODEL_PATH, NGRAM_NARROW_HEADS, ROOT, WORK, FOLDS_BY_TEXT, examples_dir, stable_folds

# Terms kept per block, the most frequent first (df >= MIN_DF): what keeps
# the shipped file near a megabyte.
VOCAB = json.loads(os.environ.get("MODERATO_NGRAM_VOCAB", '{"words": 20000, "chars": 40000}'))
MIN_DF = 2
C = float(os.environ.get("MODERATO_NGRAM_C", "4"))
FOLDS = 5
SEED = 20261126
OOF_PATH = WORK / "ngram_oof.npy"


def read_rows(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def count_terms(texts, windows=None):
    """(row, hash, count, block) arrays of every distinct term of every row,
    and each row's text: a row is a whole text, or with `windows` ("wide"
    or "narrow") one of the windows a text is scored by
    (ngrams::for_each_window)."""
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "in.jsonl", Path(d) / "out.terms"
        with open(src, "w") as f:
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
        args = [str(examples_dir() / "ngram_terms"), str(src), str(out)] + (["--windows", windows] if windows else [])
        subprocess.run(args, check=True, cwd=ROOT)
        a = np.fromfile(out, dtype="<u4").reshape(-1, 3)
        owner = np.fromfile(str(out) + ".owner", dtype="<u4").astype(np.int64) if windows else np.arange(len(texts))
    terms = a[:, 0].astype(np.int64), a[:, 1], (a[:, 2] & 0x7FFFFFFF).astype(np.float64), (a[:, 2] >> 31).astype(np.int64)
    return terms, owner


def only_lines(mask, line, hashes, block):
    """The terms of the rows where `mask` (per row) is true."""
    keep = mask[line]
    return line[keep], hashes[keep], block[keep]


def vocabulary(n_texts, line, hashes, block):
    """Kept terms: per block the VOCAB most frequent with df >= MIN_DF; a hash
    seen in both blocks (a 32-bit collision) is dropped from both. Returns
    hashes (ascending) and their idf, as the model file stores it."""
    keys = hashes.astype(np.int64) | (block << 32)
    uniq, df = np.unique(keys, return_counts=True)
    ub, uh = uniq >> 32, (uniq & 0xFFFFFFFF).astype(np.uint32)
    both = np.intersect1d(uh[ub == 0], uh[ub == 1])
    kept = []
    for b, name in ((0, "words"), (1, "chars")):
        sel = np.where((ub == b) & (df >= MIN_DF) & ~np.isin(uh, both))[0]
        sel = sel[np.argsort(-df[sel], kind="stable")][: VOCAB[name]]
        kept.append(sel)
    kept = np.concatenate(kept)
    h, d = uh[kept], df[kept]
    order = np.argsort(h)
    h, d = h[order], d[order]
    # sklearn's smooth idf, stored to 1/1000 (u16): the stored value is used here too.
    idf_milli = np.round((np.log((1 + n_texts) / (1 + d)) + 1) * 1000).astype(np.uint16)
    return h, idf_milli.astype(np.float64) / 1000


def design(n_texts, line, hashes, counts, block, vocab, idf):
    """Rows as ngrams.rs computes them: (1 + ln count) · idf over known
    terms, each block scaled to unit length."""
    col = np.searchsorted(vocab, hashes)
    col = np.minimum(col, len(vocab) - 1)
    known = vocab[col] == hashes
    line, col, counts, block = line[known], col[known], counts[known], block[known]
    v = (1 + np.log(counts)) * idf[col]
    norms = np.zeros((n_texts, 2))
    np.add.at(norms, (line, block), v * v)
    norms = np.sqrt(norms)
    v = v / norms[line, block]
    return csr_matrix((v, (line, col)), shape=(n_texts, len(vocab)))


def fit(X, labels, weights):
    """One logistic regression per head, quantised as shipped: (W, b), W
    (terms, heads) already int8 × per-head scale."""
    W = np.zeros((X.shape[1], len(HEADS)))
    b = np.zeros(len(HEADS))
    for j, h in enumerate(HEADS):
        y = labels[:, j]
        k = ~np.isnan(y)
        m = LogisticRegression(C=C, max_iter=3000, class_weight="balanced")
        m.fit(X[k], y[k].astype(int), sample_weight=weights[k])
        W[:, j], b[j] = m.coef_[0], m.intercept_[0]
    return quantise(W, b)


def quantise(W, b):
    scale = np.maximum(np.abs(W).max(axis=0), 1e-12) / 127
    q = np.clip(np.round(W / scale), -127, 127)
    return q, scale.astype(np.float32), b.astype(np.float32)


def logits(X, model):
    q, scale, b = model
    return np.asarray(X @ (q * scale.astype(np.float64))) + b


def strongest(Z, owner, n):
    """Per text (of n), per head, the strongest of its windows' logits."""
    out = np.full((n, Z.shape[1]), -np.inf)
    np.maximum.at(out, owner, Z)
    return out


def write_model(path, vocab, idf, model):
    q, scale, b = model
    with open(path, "wb") as f:
        f.write(b"MNG1" + struct.pack("<II", len(vocab), len(HEADS)))
        f.write(b.astype("<f4").tobytes() + scale.astype("<f4").tobytes())
        rows = np.zeros(len(vocab), dtype=[("h", "<u4"), ("idf", "<u2"), ("w", "i1", (len(HEADS),))])
        rows["h"], rows["idf"], rows["w"] = vocab, np.round(idf * 1000).astype(np.uint16), q.astype(np.int8)
        f.write(rows.tobytes())


def fold_splits(rows):
    """(training, held-out) row indices of each fold: by text
    (MODERATO_FOLDS=text), or by the KFold draw the shipped model's were."""
    if FOLDS_BY_TEXT:
        folds = stable_folds([r["text"] for r in rows], FOLDS, f"ngrams:{SEED}")
        return [(np.where(folds != k)[0], np.where(folds == k)[0]) for k in range(FOLDS)]
    return list(KFold(FOLDS, shuffle=True, random_state=SEED).split(np.arange(len(rows))))


def main():
    rows = read_rows(WORK / "dataset.jsonl")
    extra = read_rows(WORK / "ngram_extra.jsonl")
    everything = rows + extra
    n = len(everything)
    labels = np.array([[np.nan if r["labels"].get(h) is None else r["labels"][h] for h in HEADS] for r in everything])
    weights = np.array([r.get("weight", 1.0) for r in everything])
    # The held-out split ("test") is what evaluate.py reports as unseen: the
    # n-gram model neither counts its terms nor learns its labels.
    learnable = np.array([r.get("split") != "test" for r in rows] + [True] * len(extra))
    (line, hashes, counts, block), _ = count_terms([r["text"] for r in everything])
    vocab, idf = vocabulary(int(learnable.sum()), *only_lines(learnable, line, hashes, block))
    X = design(n, line, hashes, counts, block, vocab, idf)
    print(f"ngrams: {n} texts ({len(extra)} only here, {int((~learnable).sum())} held out), {len(vocab)} terms",
          file=sys.stderr)
    # The dataset rows as served: by their windows, wide or narrow per head.
    cuts = {}
    for cut in ("wide", "narrow"):
        (wline, whashes, wcounts, wblock), owner = count_terms([r["text"] for r in rows], windows=cut)
        cuts[cut] = (design(len(owner), wline, whashes, wcounts, wblock, vocab, idf), owner)
    narrow = np.array([h in NGRAM_NARROW_HEADS for h in HEADS])

    oof = np.zeros((len(rows), len(HEADS)))
    extra_idx = np.arange(len(rows), n)
    for k, (tr, te) in enumerate(fold_splits(rows)):
        fold = np.concatenate([tr[learnable[tr]], extra_idx])
        model = fit(X[fold], labels[fold], weights[fold])
        for cut, (XW, owner) in cuts.items():
            in_te = np.isin(owner, te)
            z = strongest(logits(XW[in_te], model), owner[in_te], len(rows))[te]
            heads = narrow if cut == "narrow" else ~narrow
            oof[np.ix_(te, heads)] = z[:, heads]
        print(f"ngrams: fold {k + 1}/{FOLDS}", file=sys.stderr)
    np.save(OOF_PATH, oof.astype(np.float32))

    model = fit(X[learnable], labels[learnable], weights[learnable])
    write_model(NGRAM_MODEL_PATH, vocab, idf, model)
    print(f"ngrams: wrote {NGRAM_MODEL_PATH} ({NGRAM_MODEL_PATH.stat().st_size} bytes) and {OOF_PATH}", file=sys.stderr)


if __name__ == "__main__":
    main()
