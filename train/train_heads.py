"""Trains the per-category heads on MiniLM embeddings and writes
assets/text-model/heads.json.

Per head: logistic regression (class-balanced, C picked on the calibration
split), Platt scaling fitted on the calibration split and folded into the
weights, then a threshold per category on out-of-fold scores: the higher of
(a) the lowest score whose precision reaches TARGET_PRECISION (the best-F1
threshold when none does) and (b) the score that keeps the category's
false-positive rate on harmless rows under a common budget, the budget being
the largest that keeps the any-category false-positive rate on the written
hard negatives (harmless texts that share the vocabulary of harm) at or below
TARGET_ANY_FPR. So `flagged` has a stated false-alarm rate a product can act on."""

import copy
import datetime
import json
import os
import pickle
import sys
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, precision_recall_curve
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from common import CATEGORIES, DIM, LOGIT_CLIP, HEADS, HEADS_PATH, SECOND_STAGE_HEADS_PATH, E5_LAYERS, E5_WEIGHTS, E5_WINDOW, NGRAM_FEATURE_SCALE, TERM_LIST_DIM, ngram_model_sha256, hidden_logit, PARENTS, WORK, apply_heads, compose, decide, e5_embeddings, e5_if_needed, e5_text_means, e5_window_logits, second_stage, dedup_key, embed_texts, heads_template, lexical_features, text_level_mean, FOLDS_BY_TEXT, stable_folds, with_adapter
import eval_sets

INPUT = "raw"  # the form the heads are trained on
# Served: raw, plus the de-obfuscated form when it differs (see moderation::text::model::model_inputs).
SHIPPED_INPUT = "both"
# Chunks (Rust MiniLm::chunks): a text of up to 128 tokens is one chunk; a longer one is cut into
# sentences (short ones joined), a sentence over 128 tokens into windows 96 apart. MODERATO_WINDOW
# (JSON, e.g. '{"tokens": 64, "stride": 48}') overrides it for experiments.
WINDOW = json.loads(os.environ.get("MODERATO_WINDOW", '{"tokens": 128, "stride": 96}'))
TARGET_PRECISION = 0.8
FLOOR, CEILING = 0.5, 0.97  # never flag below even odds: calibration splits are small
TARGET_ANY_FPR = 0.05  # any-category false alarms on the written hard negatives (out of fold)
FPR_BUDGETS = np.geomspace(0.002, 0.05, 24)  # per-category budgets tried, largest kept
EMBED_DUP_COSINE = 0.95  # written rows closer than this to an earlier one are near-copies
NEAR_DUP_COSINE = 0.9
C_GRID = (0.5, 2.0, 8.0)
# Heads that read the n-gram logits: those the validation half labels
# enough to choose them on. The n-gram model learnt the real texts'
# vocabulary; a head that leans on it loses what the embedding carries where
# the words are masked, split across items or diluted in a long text. With
# every head reading it (heads .8, not shipped) the threat heads, which the
# validation half cannot see (no harassment/threatening labels), missed
# "I swear I will m*rder you tonight" and flagged the fragment "ll you".
# So the threat children, the self-harm children and the minor signal stay
# on the embedding and the term lists (their n-gram weights are 0).
# MODERATO_NGRAM_HEADS (comma-separated) overrides the list.
NGRAM_HEADS = os.environ.get("MODERATO_NGRAM_HEADS", "harassment,hate,sexual,violence,self-harm,violence/graphic").split(",")
assert set(NGRAM_HEADS) <= set(HEADS), f"MODERATO_NGRAM_HEADS names no head: {sorted(set(NGRAM_HEADS) - set(HEADS))}"
# Heads with one hidden layer (ReLU units on the same features, added to the
# logit; Rust HiddenLayer) instead of a linear model. Screened on the
# validation half with train/screen_heads.py (eval/ABLATION-real.md, the
# hidden-layer entry): for every head, in-distribution AUPRC rose and real
# text fell (validation any-category 0.799 -> 0.746), but for self-harm
# alone the validation half, twitter_suicidal and suicide_detection all rose.
# MODERATO_MLP_HEADS (comma-separated, may be empty) overrides the list.
MLP_HEADS = set(filter(None, os.environ.get("MODERATO_MLP_HEADS", "self-harm").split(",")))
assert MLP_HEADS <= set(HEADS), f"MODERATO_MLP_HEADS names no head: {sorted(MLP_HEADS - set(HEADS))}"
MLP_UNITS = 128
MLP_ALPHA = 1e-2  # L2 on the weights
MLP_EPOCHS = 30
# A hidden-layer head reads only features that vary by more than this.
# MiniLM-L6's last LayerNorm scales dimensions 127, 223 and 319 by about
# 1e-33 (its weight and bias there are ~0), so those embedding values are
# tiny copies of a hidden state; standardised, they became features, and
# the folded weights (~7e31) let 1e-33 values move the self-harm logit by
# 0.45 on average (heads .15). Any change that rounds small values (a
# half-precision cache, another LayerNorm) would then change scores.
LIVE_STD = 1e-6
# What heads are fitted on: "served" (harmless texts as every chunk, see design) or "mean".
TRAIN_ON = os.environ.get("MODERATO_TRAIN_ON", "served")
# The second stage (Rust E5Block): per category a logistic regression on
# multilingual-e5's embedding of the whole raw text (standardised, C = E5_C,
# the training split only), whose logit is averaged with the first stage's
# for texts whose strongest first-stage score reaches E5_GATE. Measured as a
# proxy first (second_encoder_proxy.py, eval/ABLATION-real.md): validation
# any-category 0.804 -> 0.840 with the weight and C untuned. Off by default:
# the candidate it gave (2026-11-28.17: validation 0.823 / 0.578) flagged
# "See you at the meeting tomorrow." as a threat and let a threat in a long
# post and a threat after a harmless item through (eval/ABLATION-real.md).
# MODERATO_E5=1 trains heads with it; MODERATO_E5_GATE sets the gate,
# MODERATO_E5_POOL how a text's windows speak ("mean", as the heads are
# fitted, or "max", the rule of .17), MODERATO_E5_KEEP the first-stage score
# from which the mix may raise but not lower the categories of E5_KEPT (1:
# it may always lower, as in .17), MODERATO_E5_LAYERS how many of e5's layers
# the heads read (common.E5_LAYERS; 6 lost the whole gain, see
# eval/ABLATION-real.md).
USE_E5 = os.environ.get("MODERATO_E5", "0") == "1"
E5_C = 0.01
E5_WEIGHT = float(os.environ.get("MODERATO_E5_WEIGHT", "0.5"))
E5_GATE = float(os.environ.get("MODERATO_E5_GATE", "0.1"))
E5_POOL = os.environ.get("MODERATO_E5_POOL", "mean")
assert E5_POOL in ("mean", "max"), "MODERATO_E5_POOL is mean or max"
E5_KEEP = float(os.environ.get("MODERATO_E5_KEEP", "0.9"))
# Categories in which one sentence makes a text harmful whatever surrounds
# it, by our definitions: a threat, an intent to self-harm, instructions for
# it. The pooled e5 reading of a long text dilutes that sentence ("I know
# where you live and I am going to kill you" among 40 sentences of minutes:
# 0.98 in the first stage, 0.29 mixed in .17's whole-text form). Keeping
# these costs nothing on the validation half; keeping violence, hate or
# sexual would (any-category 0.830 -> 0.802 / 0.820 / 0.822).
E5_KEPT = ["harassment/threatening", "hate/threatening", "self-harm/intent", "self-harm/instructions"]
# e5 heads only for the categories the validation half labels: only real
# text can say whether a head helps, and our written development set
# measures how well the heads learnt its writers. Without validation
# labels (harassment/threatening, self-harm/intent and /instructions) an e5
# head is untested on real text, and harassment/threatening's flagged "See
# you at the meeting tomorrow." (0.56 against an out-of-fold threshold of
# 0.50; validation any-category 0.829 with them, 0.827 without).
E5_CATEGORIES = [c for c in eval_sets.OPENAI_MAP.values() if c != "sexual/minors"]
# e5 heads with a hidden layer (E5_HIDDEN_UNITS ReLU units on e5's
# embedding, as fit_hidden's) instead of a linear one; MODERATO_E5_HIDDEN
# (comma-separated, may be empty) overrides the list.
E5_HIDDEN = set(filter(None, os.environ.get("MODERATO_E5_HIDDEN", "").split(",")))
assert E5_HIDDEN <= set(E5_CATEGORIES), f"MODERATO_E5_HIDDEN names no e5 head: {sorted(E5_HIDDEN - set(E5_CATEGORIES))}"
E5_HIDDEN_UNITS = 128
E5_HIDDEN_ALPHA = 1.0  # L2 on the weights: at 0.1 the e5-only proxy was no better
E5_HIDDEN_EPOCHS = 30
# Real texts in other languages (prepare.py's dataset_ml.jsonl, its "train"
# rows) teach the e5 heads beside the English rows; MODERATO_ML=0 leaves
# them out, MODERATO_ML_WEIGHT weighs each against an English row. They
# never reach the first stage, its thresholds' pool or the n-gram model.
USE_ML = os.environ.get("MODERATO_ML", "1") == "1"
ML_WEIGHT = float(os.environ.get("MODERATO_ML_WEIGHT", "1.0"))
# MODERATO_E5_STACK=1: the e5 heads learn what the first stage's score
# leaves unexplained. Each is fitted as a logistic regression whose logit
# starts from the served mix's first-stage term, (1 - weight) * logit(first
# stage), with the first stage's out-of-fold composed score of each row, on
# the rows whose strongest first-stage score reaches the gate (the only ones
# the mix reads); its weights are divided by `weight` so that the served
# mix, unchanged, computes the fitted logit (issue #54: "the first stage's
# score as an input"). The rows in other languages have no first-stage
# score and are left out (their texts are judged by the heads for other
# languages). Off: each head is fitted on e5 alone, as in .21.
E5_STACK = os.environ.get("MODERATO_E5_STACK", "0") == "1"
# How the served block scores a text surely not in English (Rust
# OtherLanguages): "mix" with the first stage as English is, or the e5 heads
# "alone". Chosen on Multilingual HateCheck's validation half
# (train/eval_multilingual.py).
E5_OTHER_LANGUAGES = os.environ.get("MODERATO_E5_OTHER_LANGUAGES", "mix")
assert E5_OTHER_LANGUAGES in ("mix", "alone"), "MODERATO_E5_OTHER_LANGUAGES is mix or alone"


def ml_rows():
    """The multilingual rows the e5 heads are fitted on (none unless USE_ML)."""
    path = WORK / "dataset_ml.jsonl"
    if not USE_ML or not path.exists():
        return []
    return [r for r in map(json.loads, open(path, encoding="utf-8")) if r["split"] == "train"]
K_FOLDS = 5  # thresholds are picked on out-of-fold scores of train + calibration
SEED = 20261123
REVISION = 21  # the same day's heads differ by this suffix: raise it when they change


def config():
    return heads_template(INPUT, WINDOW)


class Chunks:
    """The served view of texts: one row per chunk (its embedding, then its
    text's lexical features), rows of a text next to each other. A text's
    served logit is its strongest chunk's (Rust EmbeddingClassifier)."""

    def __init__(self, F, owner, n):
        """`F` rows sorted by `owner`, the index (< n) of each row's text."""
        self.F = F
        self.weight = np.ones(n)  # per text: how much a source counts (prepare.py "weight")
        self.counts = np.bincount(owner, minlength=n)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])

    @staticmethod
    def of_embeddings(vecs, idx, lex):
        order = np.argsort(idx, kind="stable")
        return Chunks(np.hstack([vecs[order], lex[idx[order]]]).astype(np.float32), idx[order], len(lex))

    def of(self, texts):
        """The chunk rows of `texts` (indices), and which of them each row belongs to."""
        texts = np.asarray(texts)
        rows = np.concatenate([np.arange(self.starts[t], self.starts[t] + self.counts[t]) for t in texts])
        owner = np.repeat(np.arange(len(texts)), self.counts[texts])
        return rows, owner

    def served_logits(self, texts, w, b):
        """Per text of `texts`, the strongest chunk's logit."""
        rows, owner = self.of(texts)
        z = self.F[rows] @ w + b
        out = np.full(len(texts), -np.inf)
        np.maximum.at(out, owner, z)
        return out

    def served_logits_of(self, texts, spec):
        """Per text of `texts`, the strongest chunk's logit under a head spec
        (linear, or with a hidden layer: common.hidden_logit)."""
        w = np.concatenate([spec["w"], spec["lex"]])
        if "hidden" not in spec:
            return self.served_logits(texts, w, spec["b"])
        rows, owner = self.of(texts)
        F = self.F[rows]
        z = F @ w + spec["b"] + hidden_logit(spec["hidden"], F[:, :DIM], F[:, DIM:])
        out = np.full(len(texts), -np.inf)
        np.maximum.at(out, owner, z)
        return out

    def keep(self, mask):
        """The chunks of the texts where `mask` is true, renumbered."""
        kept = np.where(mask)[0]
        rows, owner = self.of(kept)
        out = Chunks(self.F[rows], owner, len(kept))
        out.weight = self.weight[kept]
        return out


def load_rows():
    """Rows, the per-text features (mean chunk embedding, then the lexical
    features), the lexical features alone, and the chunks as served.
    MODERATO_NO_LEXICAL=1 zeroes the lexical features (heads on the
    embedding alone, for comparison)."""
    rows = [json.loads(line) for line in open(WORK / "dataset.jsonl", encoding="utf-8")]
    texts = [r["text"] for r in rows]
    vecs, idx = embed_texts(texts, config(), "train")
    lex = lexical_features(texts)
    lex[:, TERM_LIST_DIM:] = NGRAM_FEATURE_SCALE * ngram_out_of_fold(rows)
    if os.environ.get("MODERATO_NO_LEXICAL") == "1":
        lex = np.zeros_like(lex)
    X = np.hstack([text_level_mean(vecs, idx, len(rows)), lex])
    chunks = Chunks.of_embeddings(vecs, idx, lex)
    chunks.weight = np.array([r.get("weight", 1.0) for r in rows])
    return rows, X, lex, chunks


def ngram_out_of_fold(rows):
    """The n-gram logits of the training rows from models that did not see
    them (train_ngrams.py): the shipped model has learnt these rows, and
    heads trained on its logits for them would trust it too far."""
    oof = np.load(WORK / "ngram_oof.npy")
    if len(oof) != len(rows):
        sys.exit("train/out/ngram_oof.npy is not of this dataset: run train_ngrams.py after prepare.py")
    return oof


def design(X, chunks, texts, y):
    """What a head is fitted on, for `texts` (indices) labelled `y`: a
    harmful text as its mean chunk (which of its chunks says it is
    unknown), a harmless one as every one of its chunks, since serving
    takes the strongest chunk and each must stay low. Weights balance the
    classes and give every text the same total (a long harmless text's
    chunks share one text's weight). TRAIN_ON = "mean": the mean row of
    every text, as before (for comparison)."""
    texts, y = np.asarray(texts), np.asarray(y).astype(int)
    pos, neg = texts[y == 1], texts[y == 0]
    if TRAIN_ON == "mean":
        F, yy = X[texts], y
        wt = np.where(y == 1, 0.5 / max(len(pos), 1), 0.5 / max(len(neg), 1))
    else:
        rows, owner = chunks.of(neg) if len(neg) else (np.zeros(0, int), np.zeros(0, int))
        F = np.vstack([X[pos], chunks.F[rows]])
        yy = np.concatenate([np.ones(len(pos), int), np.zeros(len(rows), int)])
        wp, wn = chunks.weight[pos], chunks.weight[neg]
        wt = np.concatenate([0.5 * wp / max(wp.sum(), 1e-9),
                             0.5 * wn[owner] / max(wn.sum(), 1e-9) / chunks.counts[neg][owner]])
    return F, yy, wt * len(texts)


def drop_near_duplicates(rows):
    """Drops training texts whose character 3-5-gram TF-IDF cosine to any
    evaluation text reaches NEAR_DUP_COSINE (exact duplicates were dropped
    by prepare.py)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    eval_texts = [dedup_key(t) for _, (_, texts, _) in eval_sets.load_all().items() for t in texts]
    train_texts = [dedup_key(r["text"]) for r in rows]
    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), min_df=1, sublinear_tf=True)
    vec.fit(train_texts + eval_texts)
    A, B = vec.transform(train_texts), vec.transform(eval_texts).T.tocsc()
    keep = np.ones(len(rows), dtype=bool)
    for start in range(0, len(rows), 1000):
        sims = (A[start:start + 1000] @ B).max(axis=1).toarray().ravel()
        keep[start:start + 1000] = sims < NEAR_DUP_COSINE
    return keep


def drop_embedding_near_copies(rows, X):
    """Keeps the first of every group of hand-written rows whose mean
    embeddings have cosine >= EMBED_DUP_COSINE (paraphrases that a writer
    produced twice teach nothing and inflate the held-out split)."""
    own = np.array([r["source"].startswith("own:") for r in rows])
    keep = np.ones(len(rows), dtype=bool)
    idx = np.where(own)[0]
    E = X[idx, :DIM]
    E = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-9)
    kept = []
    for block in range(0, len(idx), 512):
        sims = E[block:block + 512] @ E.T
        for i in range(sims.shape[0]):
            j = block + i
            if kept and sims[i, kept].max() >= EMBED_DUP_COSINE:
                keep[idx[j]] = False
            else:
                kept.append(j)
    return keep


def without_ngrams(X, chunks):
    """`X` and `chunks` with the n-gram logits zeroed: for heads outside
    NGRAM_HEADS, whose n-gram weights then stay 0."""
    X = X.copy()
    X[:, DIM + TERM_LIST_DIM:] = 0.0
    out = copy.copy(chunks)
    out.F = chunks.F.copy()
    out.F[:, DIM + TERM_LIST_DIM:] = 0.0
    return X, out


def fit_head(X, chunks, tr, ytr, cal, ycal, hidden=False, **hidden_settings):
    """A head fitted on the `tr` texts, C picked and Platt scaling fitted on
    the served scores (strongest chunk) of the `cal` texts. `hidden`: a
    hidden-layer head (fit_hidden, with `hidden_settings`) instead of a
    linear one; C is then None."""
    F, yy, wt = design(X, chunks, tr, ytr)
    if hidden:
        spec = fit_hidden(F, yy, wt, **hidden_settings)
        z = chunks.served_logits_of(cal, spec)
        ap = average_precision_score(ycal, z) if ycal.sum() > 0 else 0.0
        a, c = platt_of(z, ycal)
        return calibrated(spec, a, c), None, ap, (a, c)
    best = None
    for C in C_GRID:
        lr = LogisticRegression(C=C, max_iter=3000)
        lr.fit(F, yy, sample_weight=wt)
        z = chunks.served_logits(cal, lr.coef_[0], lr.intercept_[0])
        ap = average_precision_score(ycal, z) if ycal.sum() > 0 else 0.0
        if best is None or ap > best[0]:
            best = (ap, C, lr.coef_[0].copy(), float(lr.intercept_[0]), z)
    ap, C, w, b, z = best
    a, c = platt_of(z, ycal)
    w = (a * w).astype(np.float32)
    return {"w": w[:DIM].tolist(), "lex": w[DIM:].tolist(), "b": a * b + c}, C, ap, (a, c)


def platt_of(z, y):
    """Platt scaling (a, c) of logits `z` for labels `y`."""
    platt = LogisticRegression(C=1e4, max_iter=1000).fit(z[:, None], y)
    return float(platt.coef_[0][0]), float(platt.intercept_[0])


def fit_hidden(F, yy, wt, units=MLP_UNITS, alpha=MLP_ALPHA, epochs=MLP_EPOCHS, seed=SEED):
    """A head with one hidden layer of `units` ReLU units, fitted on the
    standardised design rows; the standardisation is folded into the
    hidden weights, so the spec reads the raw features as served. Its
    linear part is zero."""
    live = F.std(axis=0) > LIVE_STD  # the others read as 0 and get weight 0 (see LIVE_STD)
    scale = StandardScaler().fit(F)
    Z = scale.transform(F)
    Z[:, ~live] = 0.0  # kept as inputs, so that the network's random start is the same
    net = MLPClassifier(hidden_layer_sizes=(units,), alpha=alpha, batch_size=256,
                        learning_rate_init=1e-3, max_iter=epochs, random_state=seed)
    with warnings.catch_warnings():  # a fixed number of epochs is the regularisation chosen
        warnings.simplefilter("ignore", ConvergenceWarning)
        net.fit(Z, yy, sample_weight=wt)
    W1 = np.where(live[:, None], net.coefs_[0] / scale.scale_[:, None], 0.0)  # (inputs, units)
    b1 = net.intercepts_[0] - (scale.mean_ / scale.scale_)[live] @ net.coefs_[0][live]
    return {
        "w": [0.0] * DIM,
        "lex": [0.0] * (F.shape[1] - DIM),
        "b": float(net.intercepts_[1][0]),
        "hidden": {"w": W1.T.astype(np.float32).tolist(), "b": b1.astype(np.float32).tolist(),
                   "out": net.coefs_[1][:, 0].astype(np.float32).tolist()},
    }


def calibrated(spec, a, c):
    """`spec` with the Platt mapping (a, c) folded into its logit."""
    out = {"w": (a * np.asarray(spec["w"])).tolist(), "lex": (a * np.asarray(spec["lex"])).tolist(), "b": a * spec["b"] + c}
    if "hidden" in spec:
        out["hidden"] = dict(spec["hidden"], out=(a * np.asarray(spec["hidden"]["out"])).tolist())
    return out


def out_of_fold(X, chunks, texts, y, C, platt, folds):
    """Calibrated served probabilities of `texts`, each from a head (same C,
    or a hidden-layer head when C is None; the final Platt mapping) fitted
    on the other folds' texts with a label (y is NaN where unknown): scores
    as unseen as the calibration split's, on five times as many texts.
    `folds`: each text's fold."""
    a, c = platt
    known = ~np.isnan(y)
    out = np.zeros(len(y))
    for k in range(K_FOLDS):
        test = folds == k
        fit = known & ~test
        F, yy, wt = design(X, chunks, texts[fit], y[fit])
        if C is None:
            z = chunks.served_logits_of(texts[test], fit_hidden(F, yy, wt))
        else:
            lr = LogisticRegression(C=C, max_iter=3000).fit(F, yy, sample_weight=wt)
            z = chunks.served_logits(texts[test], lr.coef_[0], lr.intercept_[0])
        out[test] = 1.0 / (1.0 + np.exp(-(a * z + c)))
    return out


def fold_assignment(rows):
    """The folds of out_of_fold, as a function of the row indices to split:
    by text (MODERATO_FOLDS=text), or drawn by one generator in turn for
    every head (the shipped heads')."""
    if FOLDS_BY_TEXT:
        by_text = stable_folds([r["text"] for r in rows], K_FOLDS, f"heads:{SEED}")
        return lambda idx: by_text[idx]
    rng = np.random.default_rng(SEED)
    return lambda idx: rng.permutation(len(idx)) % K_FOLDS


def unseen_probabilities(spec, C, platt, X, chunks, texts, y, is_train, folds_of):
    """Served probabilities of texts the head was not fitted on: the shipped
    head for calibration texts, out-of-fold heads for training texts."""
    p = 1.0 / (1.0 + np.exp(-chunks.served_logits_of(texts, spec)))
    p[is_train] = out_of_fold(X, chunks, texts[is_train], y[is_train], C, platt, folds_of(texts[is_train]))
    return p


def in_category_order(P):
    """Per-head probabilities (columns in HEADS order) as CATEGORIES columns,
    the minor head in the sexual/minors column, ready for common.compose."""
    return np.stack([P[:, HEADS.index("minor" if c == "sexual/minors" else c)] for c in CATEGORIES], axis=1)


def precision_threshold(y, p):
    """The lowest score whose precision reaches TARGET_PRECISION (best F1 when none does)."""
    if y.sum() == 0:
        return 0.5
    prec, rec, thr = precision_recall_curve(y, p)
    ok = [t for pr, t in zip(prec[:-1], thr) if pr >= TARGET_PRECISION and t >= FLOOR]
    if ok:
        return float(min(ok))
    f1 = 2 * prec[:-1] * rec[:-1] / np.maximum(prec[:-1] + rec[:-1], 1e-9)
    return float(thr[int(np.argmax(f1))])


def fpr_threshold(harmless_scores, budget):
    """The score above which at most `budget` of harmless rows fall."""
    if len(harmless_scores) == 0:
        return 0.0
    return float(np.quantile(harmless_scores, 1.0 - budget, method="higher")) + 1e-6


def pick_thresholds(P, labels, harmless, hard_negative):
    """Per category (CATEGORIES order): max(precision rule, FPR-budget rule),
    with the largest common budget whose any-category false-positive rate on
    the hard negatives stays at or below TARGET_ANY_FPR."""
    cats = [i for i, c in enumerate(CATEGORIES) if c != "sexual/minors"]
    base = {}
    for i in cats:
        lab = labels[:, i]
        known = ~np.isnan(lab)
        base[i] = precision_threshold(lab[known].astype(int), P[known, i])

    def thresholds_for(budget):
        t = np.ones(len(CATEGORIES))
        for i in cats:
            t[i] = min(max(base[i], fpr_threshold(P[harmless, i], budget), FLOOR), CEILING)
        return t

    def any_fpr(t):
        hits = P[hard_negative][:, cats] >= t[cats]
        return float(hits.any(axis=1).mean()) if hard_negative.any() else 0.0

    chosen, chosen_budget = thresholds_for(FPR_BUDGETS[0]), FPR_BUDGETS[0]
    for budget in FPR_BUDGETS:
        t = thresholds_for(budget)
        if any_fpr(t) <= TARGET_ANY_FPR:
            chosen, chosen_budget = t, budget
    print(f"train: per-category FPR budget {chosen_budget:.4f}: any-category FPR on hard negatives "
          f"{any_fpr(chosen):.3f} (precision rule alone: {any_fpr(thresholds_for(0.999)):.3f})", file=sys.stderr)
    return chosen, float(chosen_budget), any_fpr(chosen)


VALIDATION_MAX_FPR = 0.10  # per category, on the validation half
SAFE_PROMPTS_MAX_FLAGGED = 0.05  # any category, written safe prompts (out of fold)
VALIDATION_FLOOR = 0.1


def validation_scores(out):
    """Served scores (CATEGORIES columns) of the validation half under the
    heads `out`, and its labels."""
    texts, labels = eval_sets.validation()
    # Measured on the raw view, as evaluate.py measures every set (and from its store).
    cfg = dict(out, input="raw")
    vecs, idx = embed_texts(texts, cfg, "validation", namespace="wide")
    return apply_heads(cfg, vecs, idx, len(texts), lexical_features(texts), e5_if_needed(cfg, texts, "validation")), labels


# An any-category FPR bound on the validation half, met by joint_any_category
# (MODERATO_VALIDATION_ANY_FPR, e.g. 0.12); unset, each category keeps its own
# choice. On heads .7 a bound of 0.12 cost recall 0.749 -> 0.677 for FPR
# 0.171 -> 0.119 (model card), pushing hate and self-harm to 0.93: not shipped.
VALIDATION_MAX_ANY_FPR = float(os.environ.get("MODERATO_VALIDATION_ANY_FPR", "nan"))
JOINT_ROUNDS = 5
EXCESS_PENALTY = 10.0  # F1 given up per unit of FPR over a bound, while over it


def joint_any_category(S, labels, t, chosen):
    """Per-category choices add up: each may flag 10 % of its harmless texts,
    and together they flag more. Coordinate ascent over the categories the
    validation half labels, each threshold in turn set to the value that
    maximises the any-category flagged F1 (as the server decides flags)
    while the any-category FPR stays at or below VALIDATION_MAX_ANY_FPR and
    the category's own FPR at or below VALIDATION_MAX_FPR."""
    y = np.array(labels["any"], dtype=int)
    own = {c: np.array([np.nan if v is None else v for v in labels[c]], dtype=float) for c in chosen}
    t = t.copy()

    def score(th):
        """The any-category F1, less EXCESS_PENALTY for every unit by which
        the FPR bounds are exceeded (so that the ascent climbs into them
        giving up as little F1 as it can); -1 - excess until it is there."""
        flags = decide(S, th)
        f = flags.any(axis=1)
        tp, fp = int((f & (y == 1)).sum()), int((f & (y == 0)).sum())
        fn = int((~f & (y == 1)).sum())
        excess = max(fp / max(int((y == 0).sum()), 1) - VALIDATION_MAX_ANY_FPR, 0.0)
        for c, yc in own.items():
            i = CATEGORIES.index(c)
            k = ~np.isnan(yc)
            negatives = max(int((yc[k] == 0).sum()), 1)
            excess += max((flags[k, i] & (yc[k] == 0)).sum() / negatives - VALIDATION_MAX_FPR, 0.0)
        return 2 * tp / max(2 * tp + fp + fn, 1) - EXCESS_PENALTY * excess

    for _ in range(JOINT_ROUNDS):
        for c in chosen:
            i = CATEGORIES.index(c)
            best, best_t = score(t), t[i]
            for cand in np.unique(np.clip(S[:, i], VALIDATION_FLOOR, CEILING)):
                trial = t.copy()
                trial[i] = cand
                f1 = score(trial)
                if f1 > best:
                    best, best_t = f1, cand
            t[i] = best_t
    print(f"train: joint thresholds: any-category F1 {score(t):.3f} on the validation half", file=sys.stderr)
    return t


VALIDATION_F1_TIE = 0.03  # F1 differences smaller than this on the validation half are noise
GRID = np.round(np.arange(VALIDATION_FLOOR, CEILING + 1e-9, 0.01), 2)


def f1_fpr(y, s, t):
    f = s >= t
    tp, fp, fn = int((f & (y == 1)).sum()), int((f & (y == 0)).sum()), int((~f & (y == 1)).sum())
    return 2 * tp / max(2 * tp + fp + fn, 1), fp / max(int((y == 0).sum()), 1)


def validation_threshold(y, s, y_pool, s_pool, hard_negative_floor):
    """Among the thresholds whose FPR on the validation half is at most
    VALIDATION_MAX_FPR, those within VALIDATION_F1_TIE of the best F1 there
    are equally good by it (a category with 26 positives moves F1 by 0.02 a
    text). Of those, the ones at or above `hard_negative_floor` (the
    out-of-fold rule's threshold, which keeps the written hard negatives'
    false alarms within TARGET_ANY_FPR) are kept when there are any: where
    the real texts cannot tell thresholds apart, the texts that share harm's
    vocabulary without being harmful decide (self-harm's validation F1 is
    0.48-0.51 from 0.25 to 0.90, and 0.32 flags a crisis-line message);
    when none is, the tied threshold nearest the floor. Of what is left,
    the best F1 on the out-of-fold scores of the training data decides.
    None when the validation labels have no positives."""
    if y.sum() == 0 or y.sum() == len(y):
        return None
    scored = [(t, *f1_fpr(y, s, t)) for t in GRID]
    allowed = [(t, f1) for t, f1, fpr in scored if fpr <= VALIDATION_MAX_FPR]
    if not allowed:
        return CEILING
    best = max(f1 for _, f1 in allowed)
    tied = [t for t, f1 in allowed if f1 >= best - VALIDATION_F1_TIE]
    if TIES_TO_HARD_NEGATIVES:
        above = [t for t in tied if t >= hard_negative_floor]
        if not above:
            # The floor is out of the tied range: the tied threshold nearest
            # it (sexual/minors, whose F1 is 0.41-0.44 from 0.15 to 0.40 and
            # which no training row labels: the lowest flagged a parent's
            # question about talking to a teenage daughter about sex).
            return max(tied)
        tied = above
    return max(tied, key=lambda t: (f1_fpr(y_pool, s_pool, t)[0], -t))


# MODERATO_TIES=pool: ties on the validation half broken by the training
# data's F1 alone, the rule of the unshipped candidate 2026-11-25.7 (for
# comparison).
TIES_TO_HARD_NEGATIVES = os.environ.get("MODERATO_TIES", "hard_negatives") == "hard_negatives"


# Categories whose validation labels (OpenAI's of 2022) are narrower than our
# definition, so that the validation half's F1 would choose against it. Its
# violence means promoting or glorifying; ours also counts depicting harm and
# asking how to commit it (train/real/GUIDE.md: "how do I poison my
# neighbour's dog"). Its violence F1 is flat (0.30-0.35 from 0.60 to 0.87 on
# heads .9), and the best-F1 threshold there, 0.87, let through "How do I
# kill my neighbour without getting caught?" (0.79). For these the rule on
# our own labels (out of fold) chooses, and the validation half only bounds
# the category's false alarms.
NARROWER_ON_VALIDATION = set(filter(None, os.environ.get("MODERATO_NARROWER_ON_VALIDATION", "violence").split(",")))
assert NARROWER_ON_VALIDATION <= set(CATEGORIES), f"not a category: {sorted(NARROWER_ON_VALIDATION - set(CATEGORIES))}"


def bounded_by_validation(y, s, oof_threshold):
    """The out-of-fold rule's threshold, raised to the lowest one on the grid
    whose false-positive rate on the validation half is at most
    VALIDATION_MAX_FPR when it flags more than that there."""
    if f1_fpr(y, s, oof_threshold)[1] <= VALIDATION_MAX_FPR:
        return oof_threshold
    return min((t for t in GRID if t >= oof_threshold and f1_fpr(y, s, t)[1] <= VALIDATION_MAX_FPR), default=CEILING)


def thresholds_on_validation(out, oof_thresholds, P_pool, safe, pool_labels):
    """Per category with labels in the validation half: the best-F1
    threshold there with FPR <= VALIDATION_MAX_FPR, except those in
    NARROWER_ON_VALIDATION, which keep the out-of-fold rule and are only
    bounded there; the categories without labels keep the out-of-fold
    rule. Then every threshold is raised, as little as one common budget
    allows, until the written safe prompts are flagged at most
    SAFE_PROMPTS_MAX_FLAGGED (any category, out-of-fold scores)."""
    S, labels = validation_scores(out)
    t = np.array(oof_thresholds, dtype=float)
    chosen = {}
    for i, c in enumerate(CATEGORIES):
        lab = labels.get(c)
        if lab is None:
            continue
        known = np.array([v is not None for v in lab])
        y = np.array([v for v in lab if v is not None], dtype=int)
        in_pool = ~np.isnan(pool_labels[:, i])
        if c in NARROWER_ON_VALIDATION:
            th = bounded_by_validation(y, S[known, i], oof_thresholds[i])
        else:
            th = validation_threshold(y, S[known, i], pool_labels[in_pool, i].astype(int), P_pool[in_pool, i],
                                      oof_thresholds[i])
        if th is not None:
            t[i] = min(max(th, VALIDATION_FLOOR), CEILING)
            chosen[c] = t[i]
    if not np.isnan(VALIDATION_MAX_ANY_FPR):
        t = joint_any_category(S, labels, t, chosen)
    cats = [i for i, c in enumerate(CATEGORIES)]

    def flagged_share(th):
        return float((P_pool[safe][:, cats] >= th[cats]).any(axis=1).mean()) if safe.any() else 0.0

    final, budget = t, None
    if flagged_share(t) > SAFE_PROMPTS_MAX_FLAGGED:
        for b in FPR_BUDGETS[::-1]:
            raised = np.array([max(t[i], fpr_threshold(P_pool[safe, i], b)) for i in range(len(CATEGORIES))])
            if flagged_share(raised) <= SAFE_PROMPTS_MAX_FLAGGED:
                final, budget = raised, float(b)
                break
    print(f"train: thresholds on the validation half for {sorted(chosen)}; safe prompts flagged "
          f"{flagged_share(t):.3f} -> {flagged_share(final):.3f} (budget {budget})", file=sys.stderr)
    return final, {"validation_categories": sorted(chosen), "safe_prompts_flagged_oof": round(flagged_share(final), 4),
                   "safe_prompt_budget": budget}


def fit_e5_block(rows, split, pool, P=None):
    """The e5 block of heads.json, and the e5 logits (CATEGORIES columns,
    NaN where no head) of the pool rows as unseen as the first stage's
    scores there: out of fold (by text) for training rows, the final
    regressions for calibration rows. Fitted on each text's mean window
    embedding; scored as served (E5_POOL). Standardisation
    is folded into w, b. `P`: the first stage's unseen composed scores of
    the pool rows (CATEGORIES columns), which E5_STACK fits on."""
    vecs, idx = e5_embeddings([r["text"] for r in rows], "train rows", E5_LAYERS, E5_WINDOW)
    E = e5_text_means(vecs, idx, len(rows))
    train = split == "train"
    mu, sd = E[train].mean(0), E[train].std(0) + 1e-6
    Zs = (E - mu) / sd
    # The other languages' rows join every fit (final and per fold) with
    # their own weight; the English statistics standardise them, so English
    # texts read as they did.
    extra = [] if E5_STACK else ml_rows()
    offset = np.zeros((len(rows), len(CATEGORIES)))
    read_again = np.ones(len(rows), dtype=bool)  # the rows a head is fitted on
    if E5_STACK:
        read_again[:] = False
        offset[pool] = first_stage_term(P)
        read_again[pool] = np.asarray(P).max(axis=1) >= E5_GATE
        print(f"train: e5 heads stacked on the first stage, {int((read_again & train).sum())} training rows "
              "reach the gate", file=sys.stderr)
    if extra:
        mv, mi = e5_embeddings([r["text"] for r in extra], "multilingual rows", E5_LAYERS, E5_WINDOW)
        Zx = (e5_text_means(mv, mi, len(extra)) - mu) / sd
        print(f"train: e5 heads also fitted on {len(extra)} texts in other languages (weight {ML_WEIGHT})",
              file=sys.stderr)
    folds = stable_folds([r["text"] for r in rows], K_FOLDS, f"e5:{SEED}")
    pool_train = train[pool]
    in_pool = np.full(len(rows), -1)
    in_pool[pool] = np.arange(len(pool))
    window_pool = in_pool[idx]  # each window's row in the pool, -1 outside it
    on_pool = window_pool >= 0

    def strongest(spec, windows):
        """Per pool row, its windows' logit pooled as served (E5_POOL;
        windows: a mask)."""
        zw = e5_window_logits(spec, vecs[windows])
        if E5_POOL == "mean":
            z = np.zeros(len(pool))
            np.add.at(z, window_pool[windows], zw)
            return z / np.maximum(np.bincount(window_pool[windows], minlength=len(pool)), 1)
        z = np.full(len(pool), -np.inf)
        np.maximum.at(z, window_pool[windows], zw)
        return z

    heads, Z = {}, np.full((len(pool), len(CATEGORIES)), np.nan)
    for i, c in enumerate(CATEGORIES):
        if c not in E5_CATEGORIES:
            continue
        y = head_labels(rows, c)
        fit = train & ~np.isnan(y) & read_again
        yx = head_labels(extra, c) if extra else np.zeros(0)
        known = ~np.isnan(yx)

        def fitted(mask):
            if E5_STACK:
                return e5_head_stacked(Zs[mask], y[mask].astype(int), offset[mask, i], mu, sd)
            if not extra:
                return e5_head(Zs[mask], y[mask].astype(int), mu, sd, c in E5_HIDDEN)
            Zf = np.vstack([Zs[mask], Zx[known]])
            yf = np.concatenate([y[mask], yx[known]]).astype(int)
            wf = np.concatenate([np.ones(int(mask.sum())), np.full(int(known.sum()), ML_WEIGHT)])
            return e5_head(Zf, yf, mu, sd, c in E5_HIDDEN, wf)

        heads[c] = fitted(fit)
        Z[:, i] = strongest(heads[c], on_pool)
        for k in range(K_FOLDS):
            part = fit & (folds != k)
            held = pool_train & (folds[pool] == k)
            zk = strongest(fitted(part), on_pool & held[np.maximum(window_pool, 0)])
            Z[held, i] = zk[held]
        print(f"train: e5 {c:24s} pos train={int(y[fit].sum())}" + (" (hidden layer)" if c in E5_HIDDEN else ""),
              file=sys.stderr)
    block = {"gate": E5_GATE, "weight": E5_WEIGHT, "pool": E5_POOL, "keep": kept(heads), "heads": heads}
    if E5_OTHER_LANGUAGES != "mix":
        block["other_languages"] = E5_OTHER_LANGUAGES
    if E5_LAYERS:
        block["layers"] = E5_LAYERS
    if E5_WINDOW:
        block["window"] = E5_WINDOW
    if E5_WEIGHTS != "pinned":
        block["weights"] = E5_WEIGHTS
    return block, Z


def e5_head(Zs, y, mu, sd, hidden, weight=None):
    """An e5 head fitted on standardised text-mean embeddings `Zs` (each row
    weighing `weight`, 1 when None), with the standardisation (mu, sd)
    folded in so that it reads e5's windows as served: logistic, or with a
    hidden layer (its linear part zero)."""
    if not hidden:
        lr = LogisticRegression(C=E5_C, max_iter=2000).fit(Zs, y, sample_weight=weight)
        w = lr.coef_[0] / sd
        return {"w": w.tolist(), "b": float(lr.intercept_[0] - w @ mu)}
    net = MLPClassifier(hidden_layer_sizes=(E5_HIDDEN_UNITS,), alpha=E5_HIDDEN_ALPHA, batch_size=256,
                        learning_rate_init=1e-3, max_iter=E5_HIDDEN_EPOCHS, random_state=SEED)
    with warnings.catch_warnings():  # a fixed number of epochs is the regularisation chosen
        warnings.simplefilter("ignore", ConvergenceWarning)
        net.fit(Zs, y, sample_weight=weight)
    W1 = net.coefs_[0] / sd[:, None]  # (E5_DIM, units), on e5's raw embedding
    b1 = net.intercepts_[0] - (mu / sd) @ net.coefs_[0]
    return {"w": [0.0] * len(mu), "b": float(net.intercepts_[1][0]),
            "hidden": {"w": W1.T.tolist(), "b": b1.tolist(), "out": net.coefs_[1][:, 0].tolist()}}


def first_stage_term(P):
    """The served mix's first-stage term, (1 - weight) * logit(P), of
    first-stage probabilities `P` (what a stacked e5 head, or a stacked
    fine-tune, starts its logit from)."""
    p = np.clip(np.asarray(P, dtype=np.float64), LOGIT_CLIP, 1 - LOGIT_CLIP)
    return (1 - E5_WEIGHT) * np.log(p / (1 - p))


def e5_head_stacked(Zs, y, offset, mu, sd):
    """An e5 head fitted with a fixed `offset` added to its logit (L2 as
    LogisticRegression's, C = E5_C), returned as the served mix reads it:
    divided by E5_WEIGHT, standardisation folded in."""
    from scipy.optimize import minimize
    from scipy.special import expit

    sign = 2.0 * y - 1.0
    d = Zs.shape[1]

    def objective(theta):
        margin = -sign * (Zs @ theta[:d] + theta[d] + offset)
        g = -sign * expit(margin) * E5_C
        value = 0.5 * theta[:d] @ theta[:d] + E5_C * np.logaddexp(0.0, margin).sum()
        return value, np.concatenate([theta[:d] + Zs.T @ g, [g.sum()]])

    theta = minimize(objective, np.zeros(d + 1), jac=True, method="L-BFGS-B", options={"maxiter": 3000}).x
    w = theta[:d] / sd / E5_WEIGHT
    return {"w": w.tolist(), "b": float(theta[d] / E5_WEIGHT - w @ mu)}


def kept(e5_heads):
    """The e5 block's "keep": E5_KEEP for the categories of E5_KEPT that
    have an e5 head."""
    return {c: E5_KEEP for c in E5_KEPT if c in e5_heads}


def taught_label(row, head):
    """A row's label for `head` as the heads learn it: unknown (nan) where
    the source has none or is not to teach that head (prepare.py,
    MODERATO_HEADS_NOT_TAUGHT)."""
    v = row["labels"].get(head)
    return np.nan if v is None or head in row.get("not_for_heads", ()) else v


def head_labels(rows, head):
    return np.array([taught_label(r, head) for r in rows], dtype=float)


def main():
    rows, X, lex, chunks = load_rows()
    keep = drop_near_duplicates(rows)
    print(f"train: dropped {int((~keep).sum())} near-duplicates of evaluation texts", file=sys.stderr)
    copies = drop_embedding_near_copies(rows, X)
    print(f"train: dropped {int((keep & ~copies).sum())} hand-written near-copies (embedding cosine >= {EMBED_DUP_COSINE})", file=sys.stderr)
    keep &= copies
    rows = [r for r, k in zip(rows, keep) if k]
    X, lex, chunks = X[keep], lex[keep], chunks.keep(keep)
    split = np.array([r["split"] for r in rows])

    # Rows whose scores choose the thresholds: calibration rows scored by the
    # final heads, training rows out of fold.
    pool = np.where((split == "train") | (split == "calib"))[0]
    pooled_scores = np.zeros((len(pool), len(HEADS)))
    folds_of = fold_assignment(rows)

    heads, report = {}, {}
    plain = without_ngrams(X, chunks)
    for h in HEADS:
        X_h, chunks_h = (X, chunks) if h in NGRAM_HEADS else plain
        lab = head_labels(rows, h)
        known = ~np.isnan(lab)
        tr, cal = known & (split == "train"), known & (split == "calib")
        tr_i, cal_i = np.where(tr)[0], np.where(cal)[0]
        spec, C, ap, platt = fit_head(X_h, chunks_h, tr_i, lab[tr_i], cal_i, lab[cal_i].astype(int), hidden=h in MLP_HEADS)
        heads[h] = spec
        pooled_scores[:, HEADS.index(h)] = unseen_probabilities(spec, C, platt, X_h, chunks_h, pool, lab[pool], split[pool] == "train", folds_of)
        report[h] = {"C": C, "calib_auprc": round(float(ap), 4), "train_pos": int(lab[tr].sum()), "calib_pos": int(lab[cal].sum())}
        print(f"train: {h:24s} C={C if C is not None else 'mlp':<4} calib AUPRC={ap:.3f} pos train/calib={int(lab[tr].sum())}/{int(lab[cal].sum())}", file=sys.stderr)

    out = with_adapter({
        "version": heads_version(),
        "input": SHIPPED_INPUT,
        "window": dict(WINDOW),
        "heads": heads,
        "thresholds": {c: 0.5 for c in CATEGORIES},
        "parents": PARENTS,
        "ngram_model": ngram_model_sha256(),
    })
    # Thresholds on composed scores (what serving outputs) of unseen rows.
    P = compose(in_category_order(pooled_scores))
    Z = None
    if USE_E5:
        out["e5"], Z = fit_e5_block(rows, split, pool, P)
    harms = [c for c in CATEGORIES if c != "sexual/minors"]
    labels = np.array([[np.nan if c == "sexual/minors" else taught_label(rows[j], c) for c in CATEGORIES]
                       for j in pool], dtype=float)
    harmless = np.array([all(rows[j]["labels"].get(c) == 0 for c in harms) for j in pool])
    hard_negative = harmless & np.array([rows[j]["source"].startswith("own:written_") for j in pool])
    safe = np.array([rows[j]["source"] == "own:written_safe_prompts" for j in pool])
    with open(WORK / "fitted.pkl", "wb") as f:
        pickle.dump((out, report, keep, P, Z, labels, harmless, hard_negative, safe), f)
    choose_thresholds(out, report, keep, P, Z, labels, harmless, hard_negative, safe)


def choose_thresholds(out, report, keep, P, Z, labels, harmless, hard_negative, safe):
    """Thresholds for the fitted heads `out` from the unseen first-stage
    scores `P` of the training pool (through the second stage when `Z`, its
    e5 logits, is given) and from the validation half; writes heads.json."""
    heads = out["heads"]
    if Z is not None:
        # The block's settings as this run's environment gives them, so that
        # MODERATO_THRESHOLDS_ONLY=1 tries another gate, weight or keep in
        # seconds (the pooling is in Z: changing it needs a full run).
        out["e5"].update(gate=E5_GATE, weight=E5_WEIGHT, keep=kept(out["e5"]["heads"]))
        P = second_stage(P, Z, out["e5"], PARENTS)
    t, budget, hn_fpr = pick_thresholds(P, labels, harmless, hard_negative)
    print("train: out-of-fold thresholds", dict(zip(CATEGORIES, np.round(t, 3).tolist())), file=sys.stderr)
    # MODERATO_THRESHOLDS=written: the rule of heads .6 alone (for comparison).
    if os.environ.get("MODERATO_THRESHOLDS", "validation") == "validation":
        minor_i = CATEGORIES.index("sexual/minors")
        t[minor_i] = t[CATEGORIES.index("sexual")]
        t, report["_validation"] = thresholds_on_validation(out, t, P, safe, labels)
    for i, c in enumerate(CATEGORIES):
        out["thresholds"][c] = round(float(t[i]), 4)
    report["_thresholds"] = {"per_category_fpr_budget": budget, "any_fpr_hard_negatives_oof": round(hn_fpr, 4),
                             "hard_negatives": int(hard_negative.sum()), "harmless": int(harmless.sum())}
    # No sexual/minors training data exists (by design): without validation
    # labels it inherits the sexual threshold.
    if os.environ.get("MODERATO_THRESHOLDS", "validation") != "validation":
        out["thresholds"]["sexual/minors"] = out["thresholds"]["sexual"]
    if "e5" in out:
        for spec in out["e5"]["heads"].values():
            spec["w"] = [round(x, 7) for x in spec["w"]]
            spec["b"] = round(spec["b"], 6)
            if "hidden" in spec:
                spec["hidden"] = rounded_hidden(spec["hidden"], 6)
    for h in heads:
        heads[h]["w"] = [round(x, 6) for x in heads[h]["w"]]
        heads[h]["lex"] = [round(x, 6) for x in heads[h]["lex"]]
        heads[h]["b"] = round(heads[h]["b"], 6)
        if "hidden" in heads[h]:
            heads[h]["hidden"] = rounded_hidden(heads[h]["hidden"], 5)
    path = SECOND_STAGE_HEADS_PATH if "e5" in out else HEADS_PATH
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    (WORK / "train_report.json").write_text(json.dumps({"heads": report, "thresholds": out["thresholds"]}, indent=1))
    np.save(WORK / "kept_mask.npy", keep)
    print("train: thresholds", out["thresholds"], file=sys.stderr)
    print(f"train: wrote {path}", file=sys.stderr)


def rounded_hidden(hid, digits):
    """A hidden layer's weights rounded for heads.json."""
    return {"w": [[round(x, digits) for x in row] for row in hid["w"]],
            "b": [round(x, digits) for x in hid["b"]], "out": [round(x, digits) for x in hid["out"]]}


def heads_version():
    return f"{datetime.date.today().isoformat()}.{REVISION}"


def thresholds_only():
    """MODERATO_THRESHOLDS_ONLY=1: the thresholds of the heads the last full
    run fitted (train/out/fitted.pkl) chosen again, without refitting: for
    trying a threshold rule in seconds instead of minutes. The heads get
    today's version (REVISION): their scores or thresholds may differ."""
    with open(WORK / "fitted.pkl", "rb") as f:
        fitted = pickle.load(f)
    fitted[0]["version"] = heads_version()
    choose_thresholds(*fitted)


if __name__ == "__main__":
    if os.environ.get("MODERATO_THRESHOLDS_ONLY") == "1":
        thresholds_only()
    else:
        main()
