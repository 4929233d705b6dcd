"""Screens a head model against the shipped one (logistic regression) on the
validation half, before any serving code is written for it: both fitted on
the same rows, features and served design (train_heads.design), both
Platt-calibrated on the calibration split's served scores, both scored on
the validation half as served (strongest chunk), composed as in serving.

Usage (after scripts/train-text-model.sh has filled train/out/):
  ../.venv/bin/python screen_heads.py mlp
  MODERATO_SCREEN_HEADS=self-harm MODERATO_SCREEN_SETS=validation,twitter_suicidal \
    MODERATO_SCREEN_MLP='{"hidden": 64, "alpha": 10, "epochs": 10, "seed": 7}' \
    ../.venv/bin/python screen_heads.py mlp
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
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

import eval_sets
import train_heads as th
from common import CATEGORIES, DIM, HEADS, compose, embed_texts, lexical_features

# MODERATO_SCREEN_MLP (JSON) overrides: {"hidden": 128, "alpha": 0.01, "epochs": 30, "seed": ...}
_MLP = json.loads(os.environ.get("MODERATO_SCREEN_MLP", "{}"))
HIDDEN = _MLP.get("hidden", 128)
ALPHA = _MLP.get("alpha", 1e-2)  # L2 on the weights
EPOCHS = _MLP.get("epochs", 30)
SEED = _MLP.get("seed", th.SEED)
RESAMPLES = 500


class Mlp:
    """One hidden layer (ReLU), fitted on the served design with its weights."""

    def __init__(self, seed):
        self.seed = seed

    def fit(self, F, y, wt):
        self.scale = StandardScaler().fit(F)
        self.net = MLPClassifier(hidden_layer_sizes=(HIDDEN,), alpha=ALPHA, batch_size=256,
                                 learning_rate_init=1e-3, max_iter=EPOCHS, random_state=self.seed)
        self.net.fit(self.scale.transform(F), y, sample_weight=wt)
        return self

    def logit(self, F):
        p = np.clip(self.net.predict_proba(self.scale.transform(F))[:, 1], 1e-7, 1 - 1e-7)
        return np.log(p / (1 - p))


class Linear:
    """The shipped head's model: class-balanced logistic regression at the C
    train_heads picked for this head."""

    def __init__(self, C):
        self.C = C

    def fit(self, F, y, wt):
        self.lr = LogisticRegression(C=self.C, max_iter=3000).fit(F, y, sample_weight=wt)
        return self

    def logit(self, F):
        return F @ self.lr.coef_[0] + self.lr.intercept_[0]


def served(model, F, owner, n):
    """Per text, its strongest chunk's logit."""
    z = model.logit(F)
    out = np.full(n, -np.inf)
    np.maximum.at(out, owner, z)
    return out


def platt(z, y):
    m = LogisticRegression(C=1e4, max_iter=1000).fit(z[:, None], y)
    return lambda s: 1.0 / (1.0 + np.exp(-(m.coef_[0][0] * s + m.intercept_[0])))


def set_features(name):
    """Chunk features, chunk owners, size and labels of an evaluation set, raw view."""
    texts, labels = eval_sets.validation() if name == "validation" else eval_sets.SETS[name][1]()
    cfg = dict(th.config(), input="raw")  # as train_heads.validation_scores measures it
    vecs, idx = embed_texts(texts, cfg, name, namespace="wide")
    lex = lexical_features(texts)
    return np.hstack([vecs, lex[idx]]).astype(np.float32), idx, len(texts), labels


def auprc(y, s):
    known = ~np.isnan(y)
    return average_precision_score(y[known], s[known]) if known.any() and y[known].sum() > 0 else np.nan


# MODERATO_SCREEN_HEADS: the heads that get the candidate model (comma-separated; default all),
# the rest keep the linear one. MODERATO_SCREEN_SETS: the sets scored (default validation).
SCREEN_HEADS = set(filter(None, os.environ.get("MODERATO_SCREEN_HEADS", ",".join(HEADS)).split(",")))
SCREEN_SETS = os.environ.get("MODERATO_SCREEN_SETS", "validation").split(",")


def plain_view(F):
    out = F.copy()
    out[:, DIM + th.TERM_LIST_DIM:] = 0.0
    return out


def fitted_heads(kind):
    """Per head: its calibrated linear model and candidate (the linear one
    where the head is not screened), with the n-gram view it reads."""
    rows, X, lex, chunks = th.load_rows()
    keep = th.drop_near_duplicates(rows) & th.drop_embedding_near_copies(rows, X)
    rows = [r for r, k in zip(rows, keep) if k]
    X, chunks = X[keep], chunks.keep(keep)
    split = np.array([r["split"] for r in rows])
    plain = th.without_ngrams(X, chunks)
    out = {}
    for h in HEADS:
        use_ngrams = h in th.NGRAM_HEADS
        X_h, chunks_h = (X, chunks) if use_ngrams else plain
        lab = np.array([np.nan if r["labels"][h] is None else r["labels"][h] for r in rows], dtype=float)
        known = ~np.isnan(lab)
        tr = np.where(known & (split == "train"))[0]
        cal = np.where(known & (split == "calib"))[0]
        F, yy, wt = th.design(X_h, chunks_h, tr, lab[tr])
        rows_cal, owner_cal = chunks_h.of(cal)
        ycal = lab[cal].astype(int)
        best = None
        for C in th.C_GRID:  # the linear head at the C the shipped pipeline would pick
            m = Linear(C).fit(F, yy, wt)
            z = served(m, chunks_h.F[rows_cal], owner_cal, len(cal))
            ap = average_precision_score(ycal, z)
            if best is None or ap > best[0]:
                best = (ap, m, z)
        models = {"linear": best}
        if h in SCREEN_HEADS:
            m = Mlp(SEED).fit(F, yy, wt)
            z = served(m, chunks_h.F[rows_cal], owner_cal, len(cal))
            models[kind] = (average_precision_score(ycal, z), m, z)
        else:
            models[kind] = best
        out[h] = (use_ngrams, {name: (m, platt(z, ycal)) for name, (ap, m, z) in models.items()})
        print(f"screen: {h:24s} calib AUPRC linear {models['linear'][0]:.3f} {kind} {models[kind][0]:.3f}", file=sys.stderr)
    return out


def column(y):
    return np.array([np.nan if v is None else v for v in y], dtype=float)


def report(name, heads, kind):
    F, idx, n, labels = set_features(name)
    views = {True: F, False: plain_view(F)}
    scores = {"linear": np.zeros((n, len(CATEGORIES))), kind: np.zeros((n, len(CATEGORIES)))}
    for h, (use_ngrams, models) in heads.items():
        col = CATEGORIES.index("sexual/minors" if h == "minor" else h)
        for model_name, (m, calibrate) in models.items():
            scores[model_name][:, col] = calibrate(served(m, views[use_ngrams], idx, n))
    if os.environ.get("MODERATO_SCREEN_BLEND") == "1":  # the mean of the two calibrated probabilities
        scores[kind] = 0.5 * (scores[kind] + scores["linear"])
    S = {m: compose(s.copy()) for m, s in scores.items()}
    print(f"== {name} ({n} texts)")
    print(f"{'category':24s} {'linear':>8s} {kind:>8s}")
    per = {m: [] for m in S}
    cols = {c: S_col for c, S_col in ((c, CATEGORIES.index(c)) for c in CATEGORIES) if c in labels}
    for c, i in cols.items():
        y = column(labels[c])
        a = {m: auprc(y, S[m][:, i]) for m in S}
        for m in S:
            per[m].append(a[m])
        print(f"{c:24s} {a['linear']:8.3f} {a[kind]:8.3f}")
    if cols:
        print(f"{'mean per-category':24s} {np.nanmean(per['linear']):8.3f} {np.nanmean(per[kind]):8.3f}")
    if "any" in labels:
        y_any = column(labels["any"])
        any_s = {m: S[m].max(axis=1) for m in S}
        print(f"{'any':24s} {auprc(y_any, any_s['linear']):8.3f} {auprc(y_any, any_s[kind]):8.3f}")
        lo, mid, hi = paired_difference(y_any, any_s[kind], any_s["linear"])
        print(f"any-category difference {kind} - linear: {mid:+.3f} ({lo:+.3f}..{hi:+.3f})")


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
    kind = sys.argv[1] if len(sys.argv) > 1 else "mlp"
    heads = fitted_heads(kind)
    for name in SCREEN_SETS:
        report(name, heads, kind)


if __name__ == "__main__":
    main()
