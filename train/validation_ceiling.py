"""How much of the validation half's gap is the encoder, and how much is
what the half's labels mean? A measurement only: the heads fitted here are
written to a scratch directory and thrown away, nothing under assets/
changes, and no choice of the shipped heads reads the result.

For each of five folds of the half, the shipped training run
(`train_heads.main`, same rows, features and settings) is repeated with the
half's other four folds added as training rows (their 2022 labels in our
head names; the minor signal 1 where S3 is, else unknown; heads the half
does not label unknown), and the heads it fits score the fold left out. The any-category AUPRC of those
out-of-fold scores, against the shipped heads' on the same texts, says what
the features the shipped heads read (MiniLM-L6's mean chunk embedding and
the lexical features) can reach when the labels they learn are the half's
own. If that stays under the issue's 0.86, what our labels mean against the
half's is not what holds the figure down; if it passes it, text and labels
like the half's are what is missing.

Usage: python validation_ceiling.py [WEIGHT]   (after prepare.py and
train_ngrams.py; MODERATO_EXAMPLES_DIR as for train_heads.py). WEIGHT is
each added row's weight (default 1, as a real row's).
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from sklearn.metrics import average_precision_score
from sklearn.model_selection import StratifiedKFold

from common import CATEGORIES, HEADS, HEADS_PATH, NGRAM_FEATURE_SCALE, TERM_LIST_DIM, WORK, lexical_features, paired_auprc_interval
import compare
import eval_sets
import train_heads

FOLDS, SEED = 5, 20261127
SOURCE = "diagnostic:validation_half"


def half_as_rows(texts, labels, which, weight):
    """The half's texts `which` as training rows in prepare.py's shape."""
    rows = []
    for i in which:
        got = {c: labels[c][i] for c in eval_sets.OPENAI_MAP.values()}
        # The minor head is the signal that a text is about a minor (serving
        # takes sexual/minors as the lesser of it and sexual): S3 says it is
        # where S3 is 1, and nothing where S3 is 0.
        got["minor"] = 1 if got.pop("sexual/minors") == 1 else None
        rows.append({"text": texts[i], "source": SOURCE, "split": "train", "weight": weight,
                     "labels": {h: got.get(h) for h in HEADS}})
    return rows


def fit_with(extra_rows, scratch: Path):
    """train_heads.main on the prepared rows plus `extra_rows`, in `scratch`;
    returns the heads it wrote there."""
    base = [json.loads(line) for line in open(WORK / "dataset.jsonl", encoding="utf-8")]
    oof = np.load(WORK / "ngram_oof.npy")
    # The added rows' n-gram logits from the shipped model, which never saw
    # the half (train_ngrams.py deduplicates against it).
    lex = lexical_features([r["text"] for r in extra_rows])
    extra_oof = lex[:, TERM_LIST_DIM:] / NGRAM_FEATURE_SCALE
    with open(scratch / "dataset.jsonl", "w", encoding="utf-8") as f:
        for r in base + extra_rows:
            f.write(json.dumps(r) + "\n")
    np.save(scratch / "ngram_oof.npy", np.vstack([oof, extra_oof]))
    keep_all = train_heads.drop_near_duplicates
    train_heads.WORK, train_heads.HEADS_PATH = scratch, scratch / "heads.json"
    # The added rows are evaluation texts by construction: exempt them from
    # the deduplication against evaluation texts, and only them.
    train_heads.drop_near_duplicates = lambda rows: keep_all(rows) | np.array([r["source"] == SOURCE for r in rows])
    try:
        train_heads.main()
    finally:
        train_heads.WORK, train_heads.HEADS_PATH, train_heads.drop_near_duplicates = WORK, HEADS_PATH, keep_all
    return json.loads((scratch / "heads.json").read_text())


def main():
    weight = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    os.environ.setdefault("MODERATO_THRESHOLDS", "written")  # thresholds play no part in AUPRC
    texts, labels = eval_sets.validation()
    y = np.array(labels["any"], dtype=float)
    idx = np.where(~np.isnan(y))[0]
    shipped, _ = compare.scores(json.loads(HEADS_PATH.read_text()), texts, "validation")
    ceiling = np.full(shipped.shape, np.nan)
    folds = StratifiedKFold(n_splits=FOLDS, shuffle=True, random_state=SEED).split(idx, y[idx])
    for k, (tr, te) in enumerate(folds):
        scratch = Path(tempfile.mkdtemp(prefix="ceiling-"))
        heads = fit_with(half_as_rows(texts, labels, idx[tr], weight), scratch)
        S, _ = compare.scores(heads, [texts[i] for i in idx[te]], f"validation fold {k}")
        ceiling[idx[te]] = S
        yk = y[idx[te]].astype(int)
        print(f"ceiling: fold {k}: with the other folds {average_precision_score(yk, S.max(axis=1)):.3f}, "
              f"shipped {average_precision_score(yk, shipped[idx[te]].max(axis=1)):.3f}", file=sys.stderr)
        shutil.rmtree(scratch)
    per_category(labels, shipped, ceiling)
    yy, a, b = y[idx].astype(int), shipped[idx].max(axis=1), ceiling[idx].max(axis=1)
    lo, hi = paired_auprc_interval(yy, a, b, SEED)
    print(f"any-category AUPRC over the half (weight {weight:g}): shipped {average_precision_score(yy, a):.3f}, "
          f"trained with the other folds {average_precision_score(yy, b):.3f} (difference {lo:+.3f}..{hi:+.3f}, 95 %)")


def per_category(labels, shipped, ceiling):
    """AUPRC per category the half labels, shipped and out of fold."""
    for c in eval_sets.OPENAI_MAP.values():
        yc = np.array(labels[c], dtype=float)
        k = ~np.isnan(yc) & ~np.isnan(ceiling[:, 0])
        j = CATEGORIES.index(c)
        print(f"{c:18s} {int(yc[k].sum()):4d} positives: shipped {average_precision_score(yc[k], shipped[k, j]):.3f}, "
              f"trained with the other folds {average_precision_score(yc[k], ceiling[k, j]):.3f}")


if __name__ == "__main__":
    main()
