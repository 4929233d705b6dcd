"""Shared helpers: categories, dataset paths, and embedding through the Rust
`embed` example so that training, evaluation and serving see the same vectors."""

import functools
import hashlib
import json
import os
import re
import pickle
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# The shared datasets sit beside the repository (../shared/datasets).
DATASETS = Path(os.environ.get("MODERATO_DATASETS", ROOT.parent / "shared" / "datasets"))
WORK = ROOT / "train" / "out"  # git-ignored scratch: prepared data, embedding cache
HEADS_PATH = ROOT / "assets" / "text-model" / "heads.json"
# The heads with a second stage, served when the operator turns it on
# (text_model.second_stage); train_heads.py writes them with MODERATO_E5=1.
SECOND_STAGE_HEADS_PATH = ROOT / "assets" / "text-model" / "heads-e5.json"
# The n-gram model the heads read (train_ngrams.py writes it; the next build
# compiles it in). The Rust examples read this file rather than the one
# compiled into them, so a model just trained is the one measured.
NGRAM_MODEL_PATH = Path(os.environ.setdefault("MODERATO_NGRAM_MODEL", str(ROOT / "assets" / "text-model" / "ngrams.bin")))

CATEGORIES = [
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
]
# Learnt heads: every category but sexual/minors (composed), plus the minor signal.
HEADS = [c for c in CATEGORIES if c != "sexual/minors"] + ["minor"]
# The n-gram heads scored by 48-word windows rather than 128-word ones in
# a long text (ngrams::NARROW_HEADS, which this mirrors).
NGRAM_NARROW_HEADS = {"self-harm", "self-harm/intent", "self-harm/instructions"}
# (child, parent): the parent score is raised to the child's.
PARENTS = [
    ["harassment/threatening", "harassment"],
    ["hate/threatening", "hate"],
    ["self-harm/intent", "self-harm"],
    ["self-harm/instructions", "self-harm"],
    ["violence/graphic", "violence"],
]
DIM = 384
E5_DIM = 384  # multilingual-e5-small, the second encoder
# Lexical features appended to the embedding by the heads: the lexical layer's
# 11 category scores (CATEGORIES order) and its minor signal, then the n-gram
# model's logit of every head (HEADS order) times NGRAM_FEATURE_SCALE,
# computed on the whole text by the Rust `lexical_features` example (as served).
TERM_LIST_DIM = len(CATEGORIES) + 1
NGRAM_FEATURE_SCALE = 0.25  # as NGRAM_FEATURE_SCALE in src/moderation/text/model/heads.rs
LEX_DIM = TERM_LIST_DIM + len(HEADS)


def dedup_key(text: str) -> str:
    """Normalised form for exact-duplicate matching across sets."""
    t = unicodedata.normalize("NFKC", text).lower()
    t = re.sub(r"@\w+|https?://\S+|&amp;|\brt\b", " ", t)
    t = re.sub(r"[^a-z0-9]+", " ", t)
    return t.strip()


# MODERATO_FOLDS=text: out-of-fold scores (train_ngrams.py, train_heads.py)
# on stable_folds, for trying a new file against a baseline retrained the
# same way. Unset: the permutation draw the shipped heads (.14, .15) were fitted
# with, so that retraining reproduces them; the next shipped revision should
# switch (eval/ABLATION-real.md, 2026-11-27 morning).
FOLD_RULE = os.environ.get("MODERATO_FOLDS", "draw")
assert FOLD_RULE in ("draw", "text"), f"MODERATO_FOLDS is draw or text, not {FOLD_RULE!r}"
FOLDS_BY_TEXT = FOLD_RULE == "text"


def stable_folds(texts, k: int, salt: str) -> np.ndarray:
    """Each text's fold of `k`, from a hash of the text (and `salt`) alone.
    A permutation of the row count (KFold, rng.permutation) reassigns every
    row's fold when one row is added, so adding a file moved every
    out-of-fold score and with them thresholds of categories the file does
    not label (hate 0.70 -> 0.66 when self-harm accounts were added,
    eval/ABLATION-real.md); a row's fold here depends on nothing else."""
    return np.array([int.from_bytes(hashlib.sha256(f"{salt}:{t}".encode()).digest()[:8], "big") % k for t in texts])


def examples_dir() -> Path:
    # MODERATO_EXAMPLES_DIR: binaries of another build (e.g. the previous
    # release's, to measure the heads before a change on their own pipeline).
    return Path(os.environ.get("MODERATO_EXAMPLES_DIR", ROOT / "target" / "debug" / "examples"))


def embed_bin() -> Path:
    return examples_dir() / "embed"


def lexical_bin() -> Path:
    return examples_dir() / "lexical_features"


# MODERATO_E5_LAYERS=n: heads trained now read the output of e5's first n
# layers (the block's "layers"), not its last.
E5_LAYERS = int(os.environ["MODERATO_E5_LAYERS"]) if os.environ.get("MODERATO_E5_LAYERS") else None
# MODERATO_E5_WINDOW=n: heads trained now read e5's scoring windows of n
# framed tokens (the block's "window"), not the service's default 128.
E5_WINDOW = int(os.environ["MODERATO_E5_WINDOW"]) if os.environ.get("MODERATO_E5_WINDOW") else None
# MODERATO_E5_WEIGHTS=finetuned: heads trained now read the fine-tuned e5
# (models/e5/e5-small-ft-q4.bin, train/finetune_e5.py; the block's
# "weights"), not the pinned file.
E5_WEIGHTS = os.environ.get("MODERATO_E5_WEIGHTS") or "pinned"


def store_tag() -> str:
    """What sets stored embeddings apart besides their texts: the kernels'
    arithmetic (EMBEDDING_ARITHMETIC) and, from MODERATO_STORE_TAG, another
    build's (compare.py names one per `@EXAMPLES` side), so that a change to
    how the service computes embeddings is measured, and heads are fitted on
    what the service computes, not on rows an older build stored."""
    extra = os.environ.get("MODERATO_STORE_TAG")
    return EMBEDDING_ARITHMETIC + (f"-{extra}" if extra else "")


def e5_weights_tag(weights) -> str:
    """Stored embeddings of the fine-tuned e5 are kept apart per file (its
    sha256's first 12 digits): another fine-tune is another encoder."""
    if weights == "pinned":
        return ""
    if weights != "finetuned":
        raise ValueError(f"e5 weights {weights!r}: expected 'pinned' or 'finetuned'")
    path = ROOT / "models" / "e5" / "e5-small-ft-q4.bin"
    stat = path.stat()
    return "-ft" + _file_sha256(str(path), stat.st_size, stat.st_mtime_ns)[:12]


@functools.lru_cache(maxsize=4)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """A file's sha256, hashed once per version of the file (size and mtime
    are in the key so that a rewritten file is hashed again): the fine-tuned
    e5 is 72 MB, and every e5_embeddings call asks for its tag."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def e5_store(layers, window=None, weights="pinned"):
    name = "windows" + (f"-L{layers}" if layers else "") + (f"-W{window}" if window else "") + e5_weights_tag(weights) + f"-{store_tag()}"
    return WORK / "e5" / f"{name}.pkl"


def e5_embeddings(texts, label: str = "", layers=None, window=None, weights=None):
    """multilingual-e5 embeddings of the raw texts as the service computes
    them (the Rust example `embed_e5`): one normalised row per scoring
    window (a text of up to 128 tokens is one), and the text index of each
    row, as embed_texts returns MiniLM's chunks. Stored per text in
    train/out/e5/windows.pkl, so only texts never seen are embedded (about
    19 ms a short text on two cores). `layers`: only the first so many of
    e5's layers (all when None), `window`: framed tokens per scoring window
    (the service's default when None), `weights`: "pinned" or "finetuned"
    (E5_WEIGHTS when None); each stored apart."""
    weights = weights or E5_WEIGHTS
    path = e5_store(layers, window, weights)
    store = pickle.loads(path.read_bytes()) if path.exists() else {}
    missing = list(dict.fromkeys(t for t in texts if _text_key(t) not in store))
    if missing:
        print(f"e5 {label}: {len(missing)} new texts", file=sys.stderr)
        with tempfile.TemporaryDirectory() as d:
            jsonl, out = Path(d) / "in.jsonl", Path(d) / "out"
            with open(jsonl, "w") as f:
                for t in missing:
                    f.write(json.dumps({"text": t}) + "\n")
            env = {k: v for k, v in os.environ.items() if k not in ("E5_LAYERS", "E5_WINDOW", "E5_WEIGHTS")}
            env["E5_WEIGHTS"] = weights
            if layers:
                env["E5_LAYERS"] = str(layers)
            if window:
                env["E5_WINDOW"] = str(window)
            subprocess.run([str(examples_dir() / "embed_e5"), str(jsonl), str(out)], check=True, cwd=ROOT, env=env)
            rows = np.fromfile(f"{out}.f32", dtype="<f4").reshape(-1, E5_DIM)
            line = np.fromfile(f"{out}.idx", dtype="<u4")
        for i, t in enumerate(missing):
            store[_text_key(t)] = rows[line == i]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(store, protocol=pickle.HIGHEST_PROTOCOL))
    parts = [store[_text_key(t)] for t in texts]
    if not parts:
        return np.zeros((0, E5_DIM), np.float32), np.zeros(0, np.int64)
    idx = np.concatenate([np.full(len(p), i) for i, p in enumerate(parts)])
    return np.concatenate(parts).astype(np.float32), idx.astype(np.int64)


def e5_text_means(vecs, idx, n):
    """One vector per text: the mean of its windows' embeddings (for
    fitting; a text of one window keeps its own)."""
    out = np.zeros((n, vecs.shape[1]), dtype=np.float64)
    np.add.at(out, idx, vecs)
    return out / np.maximum(np.bincount(idx, minlength=n), 1)[:, None]


def ngram_model_sha256() -> str:
    return _sha256(NGRAM_MODEL_PATH)


def lexical_features(texts) -> np.ndarray:
    """(len(texts), LEX_DIM) lexical features, computed by the Rust example
    with the same code that serves (microseconds a text: not cached)."""
    with tempfile.TemporaryDirectory() as d:
        jsonl, out = Path(d) / "in.jsonl", Path(d) / "out.lex"
        with open(jsonl, "w") as f:
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
        subprocess.run([str(lexical_bin()), str(jsonl), str(out)], check=True, cwd=ROOT)
        return np.fromfile(out, dtype="<f4").reshape(-1, LEX_DIM)


# The encoder adapter (train/finetune_encoder.py) that new heads are trained
# on: $MODERATO_ENCODER_ADAPTER names a candidate's file; unset, the base
# encoder (no adapter is shipped, see eval/ABLATION-real.md).


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def training_adapter() -> "Path | None":
    chosen = os.environ.get("MODERATO_ENCODER_ADAPTER")
    return Path(chosen) if chosen else None


def adapter_path(sha256: str) -> Path:
    """The adapter file whose sha256 a heads file names: the candidate of
    $MODERATO_ENCODER_ADAPTER."""
    path = training_adapter()
    if path is not None and path.exists() and _sha256(path) == sha256:
        return path
    sys.exit(f"no encoder adapter with sha256 {sha256}: set MODERATO_ENCODER_ADAPTER to its file")


def with_adapter(heads: dict) -> dict:
    """`heads` naming the training adapter (none: the base encoder)."""
    heads = dict(heads)
    heads.pop("encoder_adapter", None)
    adapter = training_adapter()
    if adapter is not None:
        heads["encoder_adapter"] = _sha256(adapter)
    return heads


def heads_template(input_kind: str, window: dict) -> dict:
    """A heads file with untrained weights, used only to tell `embed` the input form, windows and encoder adapter."""
    return with_adapter({
        "version": "template",
        "input": input_kind,
        "window": dict(window),
        "heads": {h: {"w": [0.0] * DIM, "lex": [0.0] * LEX_DIM, "b": 0.0} for h in HEADS},
        "thresholds": {c: 0.5 for c in CATEGORIES},
        "parents": PARENTS,
    })


PIECE = 384  # texts per embed run: the store is saved after each, so an interrupted run resumes


# Names the encoder's numerics and how texts are cut: raise it when they
# change (8-bit dense layers since heads 2026-11-23.4; unpadded passes with
# an f32 erf, and sentence chunks instead of 256-token windows plus a
# sentence view, since issue #11), so stores of older embeddings are never reused.
ENCODER = "minilm-l6-int8-blocks32-chunks"
# How the int8-matmul kernels sum a block ("grouped": an exact integer per
# block and output column, scaled once). Change it whenever a kernel change
# moves embeddings, so that no stored row of the old arithmetic is reused.
EMBEDDING_ARITHMETIC = "grouped"


def _store_path(config: dict, namespace: str) -> Path:
    key = {k: config[k] for k in ("input", "window")}
    key["encoder"] = ENCODER
    key["store"] = store_tag()
    if config.get("encoder_adapter"):
        key["encoder_adapter"] = config["encoder_adapter"]
    h = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    prefix = "store" if namespace == "train" else f"store-{namespace}"
    return WORK / "cache" / f"{prefix}-{h}.pkl"


def _text_key(t: str) -> str:
    return hashlib.sha256(t.encode("utf-8", "replace")).hexdigest()


def load_store(config: dict, namespace: str = "train") -> dict:
    path = _store_path(config, namespace)
    if path.exists():
        with open(path, "rb") as f:
            return pickle.load(f)
    return {}


def save_store(config: dict, store: dict, namespace: str = "train"):
    path = _store_path(config, namespace)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(store, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)


def _run_embed(texts, config: dict):
    """Per text, its (chunks, 384) embeddings, computed by the Rust example:
    one row per sentence chunk of each view (raw, and de-obfuscated when that
    differs), exactly the rows the served heads read for an item."""
    with tempfile.TemporaryDirectory() as d:
        jsonl, prefix, heads = Path(d) / "in.jsonl", Path(d) / "out", Path(d) / "heads.json"
        with open(jsonl, "w") as f:
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
        heads.write_text(json.dumps(config))
        env = dict(os.environ)
        env.pop("MODERATO_ENCODER_ADAPTER", None)
        if config.get("encoder_adapter"):
            env["MODERATO_ENCODER_ADAPTER"] = str(adapter_path(config["encoder_adapter"]))
        subprocess.run([str(embed_bin()), str(jsonl), str(prefix), str(heads)], check=True, cwd=ROOT, env=env)
        vecs = np.fromfile(prefix.with_suffix(".f32"), dtype="<f4").reshape(-1, DIM)
        idx = np.fromfile(prefix.with_suffix(".idx"), dtype="<u4").astype(np.int64)
    return [vecs[idx == i] for i in range(len(texts))]


def embed_texts(texts, config: dict, label: str = "", namespace: str = "train"):
    """Window embeddings of `texts`: (rows, 384) float32 and the text index of
    each row. Embeddings are stored per text (keyed by input form and windows)
    under train/out/cache, so only texts never seen are embedded."""
    store = load_store(config, namespace)
    missing = list(dict.fromkeys(t for t in texts if _text_key(t) not in store))
    for start in range(0, len(missing), PIECE):
        piece = missing[start:start + PIECE]
        print(f"embed {label}: {start}/{len(missing)} new texts", file=sys.stderr)
        for t, e in zip(piece, _run_embed(piece, config)):
            store[_text_key(t)] = e
        save_store(config, store, namespace)
    parts = [store[_text_key(t)] for t in texts]
    vecs = np.concatenate(parts) if parts else np.zeros((0, DIM), np.float32)
    idx = np.concatenate([np.full(len(p), i) for i, p in enumerate(parts)]) if parts else np.zeros(0, np.int64)
    return vecs.astype(np.float32), idx.astype(np.int64)


def text_level_mean(vecs, idx, n):
    """One vector per text (mean of its windows) for training."""
    out = np.zeros((n, DIM), dtype=np.float32)
    counts = np.bincount(idx, minlength=n).astype(np.float32)
    np.add.at(out, idx, vecs)
    out /= np.maximum(counts, 1)[:, None]
    return out


def apply_heads(heads: dict, vecs, idx, n, lex=None, e5=None):
    """Scores per text exactly as the Rust classifier computes them:
    per-window sigmoid heads (embedding and the text's lexical features),
    max over windows, then composition; then, for heads with an e5 block,
    the second stage (`e5`: the texts' e5_embeddings, see second_stage).
    Every text must have e5 windows (np.maximum.at leaves none out)."""
    names = [c for c in CATEGORIES]
    W = np.zeros((len(names), DIM), dtype=np.float32)
    U = np.zeros((len(names), LEX_DIM), dtype=np.float32)
    b = np.zeros(len(names), dtype=np.float32)
    for i, c in enumerate(names):
        spec = heads["heads"]["minor" if c == "sexual/minors" else c]
        W[i] = spec["w"]
        weights = spec.get("lex") or []
        U[i, : len(weights)] = weights  # heads of before the n-gram model have TERM_LIST_DIM
        b[i] = spec["b"]
    z = vecs @ W.T + b
    if lex is not None:
        z = z + (lex @ U.T)[idx]
    elif U.any():
        raise ValueError("these heads read lexical features: pass lex")
    for i, c in enumerate(names):
        hidden = heads["heads"]["minor" if c == "sexual/minors" else c].get("hidden")
        if hidden:
            if lex is None:
                raise ValueError("these heads have a hidden layer, which reads lexical features: pass lex")
            z[:, i] += hidden_logit(hidden, vecs, lex[idx])
    p = 1.0 / (1.0 + np.exp(-z))
    out = np.zeros((n, len(names)), dtype=np.float32)
    np.maximum.at(out, idx, p)
    out = compose(out, heads.get("parents", []))
    if heads.get("e5"):
        if e5 is None:
            raise ValueError("these heads have an e5 block: pass e5 (e5_embeddings of the texts)")
        out = second_stage(out, e5_logits(heads["e5"], e5), heads["e5"], heads.get("parents", []))
    return out


def e5_if_needed(heads: dict, texts, label: str = ""):
    """The texts' e5 window embeddings (rows, text index) when `heads` read
    them, else None."""
    block = heads.get("e5")
    return e5_embeddings(texts, label, block.get("layers"), block.get("window"), block.get("weights", "pinned")) if block else None


def e5_logits(block: dict, e5):
    """The e5 heads' logits per text (CATEGORIES columns, NaN where a
    category has no e5 head), as Rust E5Block::mix pools them: the mean over
    the text's windows (the logit of the mean embedding the heads were
    fitted on) when block["pool"] is "mean", else the strongest window.
    `e5` is e5_embeddings' (rows, text index) of one view per text."""
    vecs, idx = e5
    n = int(idx.max()) + 1 if len(idx) else 0
    Z = np.full((n, len(CATEGORIES)), np.nan, dtype=np.float64)
    counts = np.maximum(np.bincount(idx, minlength=n), 1)
    for c, spec in block["heads"].items():
        zw = e5_window_logits(spec, vecs)
        if block.get("pool", "max") == "mean":
            z = np.zeros(n)
            np.add.at(z, idx, zw)
            z /= counts
        else:
            z = np.full(n, -np.inf)
            np.maximum.at(z, idx, zw)
        Z[:, CATEGORIES.index(c)] = z
    return Z


def e5_window_logits(spec: dict, vecs) -> np.ndarray:
    """One e5 head's logit per window (Rust E5Head::logit): linear, plus
    its hidden layer's ReLU units when it has one."""
    vecs = np.asarray(vecs, dtype=np.float64)
    z = vecs @ np.asarray(spec["w"], dtype=np.float64) + spec["b"]
    if "hidden" in spec:
        h = spec["hidden"]
        a = vecs @ np.asarray(h["w"], dtype=np.float64).T + np.asarray(h["b"], dtype=np.float64)
        z = z + np.maximum(a, 0.0) @ np.asarray(h["out"], dtype=np.float64)
    return z


LOGIT_CLIP = 1e-6


def second_stage(S, Z, block: dict, parents=PARENTS):
    """Rust E5Block: for texts whose strongest composed score reaches the
    gate, each category with an e5 head gets the sigmoid of
    (1 - weight) * logit(score) + weight * e5 logit, except that in the
    categories of block["keep"] a first-stage score at or over the value
    given there is never lowered (one sentence the chunks found makes the
    text a threat, whatever surrounds it; a pooled reading of the whole
    dilutes it); then parents are raised to their children again, sexual
    to sexual/minors too (which the first stage composes under it)."""
    S = np.array(S, dtype=np.float64)
    gated = S.max(axis=1) >= block["gate"]
    a = block["weight"]
    for i, c in enumerate(CATEGORIES):
        if np.isnan(Z[:, i]).all():
            continue
        s = S[gated, i]
        p = np.clip(s, LOGIT_CLIP, 1 - LOGIT_CLIP)
        mixed = 1.0 / (1.0 + np.exp(-((1 - a) * np.log(p / (1 - p)) + a * Z[gated, i])))
        keep = block.get("keep", {}).get(c, np.inf)
        S[gated, i] = np.where(s >= keep, np.maximum(s, mixed), mixed)
    # sexual is raised to its kind sexual/minors, as every parent (Rust Heads::with_e5).
    si, mi = CATEGORIES.index("sexual"), CATEGORIES.index("sexual/minors")
    S[gated, si] = np.maximum(S[gated, si], S[gated, mi])
    for child, parent in parents:
        ci, pi = CATEGORIES.index(child), CATEGORIES.index(parent)
        S[gated, pi] = np.maximum(S[gated, pi], S[gated, ci])
    return S.astype(np.float32)


def hidden_logit(hidden: dict, vecs, lex_rows):
    """What a head's hidden layer adds to its logit, per window (Rust
    HiddenLayer::logit): ReLU units on the embedding, then the lexical
    features."""
    F = np.hstack([vecs, lex_rows]).astype(np.float32)
    a = F @ np.asarray(hidden["w"], dtype=np.float32).T + np.asarray(hidden["b"], dtype=np.float32)
    return np.maximum(a, 0.0) @ np.asarray(hidden["out"], dtype=np.float32)


def decide(S, thresholds, parents=PARENTS):
    """Flags per text and category as the server decides them (Rust
    Thresholds::decide): a score at or over its threshold, or a flagged
    kind of the category (violence/graphic flags violence)."""
    flags = S >= thresholds
    for child, parent in list(parents) + [("sexual/minors", "sexual")]:
        ci, pi = CATEGORIES.index(child), CATEGORIES.index(parent)
        flags[:, pi] |= flags[:, ci]
    return flags


def compose(out, parents=PARENTS):
    """Final scores from head probabilities in CATEGORIES order, with the
    minor head in the sexual/minors column (as Heads::compose in Rust):
    sexual/minors = min(sexual, minor), parents raised to their children."""
    si, mi = CATEGORIES.index("sexual"), CATEGORIES.index("sexual/minors")
    out[:, mi] = np.minimum(out[:, si], out[:, mi])
    for child, parent in parents:
        ci, pi = CATEGORIES.index(child), CATEGORIES.index(parent)
        out[:, pi] = np.maximum(out[:, pi], out[:, ci])
    return out


def paired_auprc_interval(y, a, b, seed: int, resamples: int = 500):
    """95 % interval of AUPRC(b) - AUPRC(a) over paired bootstrap resamples of
    the texts (resamples with one class only skipped). New measurements use
    this one; compare.py, screen_heads.py and layers_proxy.py keep their own
    draws until their recorded intervals are next refreshed."""
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(seed)
    d = []
    for _ in range(resamples):
        r = rng.integers(0, len(y), len(y))
        if 0 < y[r].sum() < len(r):
            d.append(average_precision_score(y[r], b[r]) - average_precision_score(y[r], a[r]))
    return np.percentile(d, 2.5), np.percentile(d, 97.5)
