"""Evaluates the shipped heads (assets/text-model/heads.json) on every
evaluation set and on the held-out test split, side by side with
alt-profanity-check, and writes eval/REPORT.md with PR-curve PNGs.

Scores are computed from the Rust encoder's window embeddings with the same
arithmetic as the served classifier (see common.apply_heads; the Rust test
`tests/it/text_model.rs` checks the served scores on sample texts)."""

import json
import os
import random
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.metrics import average_precision_score, precision_recall_curve  # noqa: E402

from common import CATEGORIES, HEADS_PATH, ROOT, WORK, apply_heads, decide, e5_if_needed, embed_texts, lexical_features  # noqa: E402
import eval_sets  # noqa: E402

OUT = ROOT / "eval"
# Figures of the heads before this version (written by the previous run as
# eval/metrics.json and kept as eval/metrics_before.json): the report shows
# them beside the new ones.
BEFORE = Path(os.environ.get("MODERATO_BEFORE", OUT / "metrics_before.json"))
# MODERATO_REPORT=NAME: write eval/REPORT-NAME.md and eval/metrics-NAME.json
# instead (the second stage's report, say, with MODERATO_BEFORE=eval/metrics.json
# for the default heads beside it), without PR curves, which are the default
# report's.
REPORT_NAME = os.environ.get("MODERATO_REPORT", "")
REPORT_PATH = OUT / (f"REPORT-{REPORT_NAME}.md" if REPORT_NAME else "REPORT.md")
METRICS_PATH = OUT / (f"metrics-{REPORT_NAME}.json" if REPORT_NAME else "metrics.json")
# The larger restricted sets are sampled (fixed seed). The samples are large
# enough that a difference of 0.01 in any-category AUPRC is mostly outside the
# noise of a set (ToxicChat whole: 5,654 prompts, 746 harmful); a run takes
# about five minutes on 2 cores with no stored embeddings.
SAMPLE = {
    "hatecheck": 600,
    "ailuminate": 1200,
    "ethos": 998,
    "ethos_violence": 433,
    "toxicchat": 5654,
    "olid": 1000,
    "twitter_suicidal": 2000,
    "suicide_detection": 500,
    "cssrs": 200,
    "threat_augmented": 200,
}


def sample_indices(name, n):
    """The fixed sample of a set (all of it when it is small)."""
    k = SAMPLE.get(name)
    if k is None or n <= k:
        return list(range(n))
    return sorted(random.Random(f"wide-{name}").sample(range(n), k))


def profanity_scores(texts):
    from profanity_check import predict_prob

    return np.asarray(predict_prob([t if t else " " for t in texts]), dtype=float)


# The held-out split is unseen by the heads and, since heads .9, by the
# n-gram layer (train_ngrams.py leaves it out); .8's n-gram layer had learnt it.
HELDOUT_NOTE = ("**heldout** is unseen by the heads and (since heads .9) by the n-gram layer; candidate .8's "
                "n-gram layer was fitted on it, so figures of .8 on it are not comparable.")


def heldout_set():
    rows = [json.loads(line) for line in open(WORK / "dataset.jsonl", encoding="utf-8")]
    keep = np.load(WORK / "kept_mask.npy") if (WORK / "kept_mask.npy").exists() else np.ones(len(rows), bool)
    rows = [r for r, k in zip(rows, keep) if k and r["split"] == "test"]
    labels = {c: [r["labels"].get(c) for r in rows] for c in CATEGORIES if c != "sexual/minors"}
    labels["any"] = [
        None if all(r["labels"].get(c) is None for c in labels) else int(any(r["labels"].get(c) == 1 for c in labels))
        for r in rows
    ]
    return [r["text"] for r in rows], labels


def metrics(y, s, t):
    y = np.asarray(y, dtype=int)
    if y.sum() == 0 or y.sum() == len(y):
        ap = float("nan")
        best_f1 = float("nan")
    else:
        ap = average_precision_score(y, s)
        prec, rec, _ = precision_recall_curve(y, s)
        best_f1 = float(np.max(2 * prec * rec / np.maximum(prec + rec, 1e-9)))
    pred = s >= t
    tp = int((pred & (y == 1)).sum())
    fp = int((pred & (y == 0)).sum())
    fn = int((~pred & (y == 1)).sum())
    f1 = 2 * tp / max(2 * tp + fp + fn, 1)
    fpr = fp / max(int((y == 0).sum()), 1) if (y == 0).any() else float("nan")
    recall = tp / max(tp + fn, 1)
    precision = tp / (tp + fp) if tp + fp else float("nan")
    return {"n": len(y), "pos": int(y.sum()), "auprc": ap, "best_f1": best_f1, "f1": f1, "fpr": fpr, "recall": recall,
            "precision": precision}


def second_stage_words(heads):
    """How the heads read a text again with e5 (text_model.second_stage), if they do."""
    block = heads.get("e5")
    if not block:
        return ""
    return (f"; then the second stage: multilingual-e5-small read again where the strongest score reaches "
            f"{block['gate']}, its heads' logit weighted {block['weight']} against the first stage's, "
            f"in {', '.join(sorted(block['heads']))}")


def fmt(x):
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.3f}"


def main():
    # MODERATO_HEADS_FILE: measure other heads than the shipped ones (the
    # previous version's, for the "before" figures).
    heads = json.loads(Path(os.environ.get("MODERATO_HEADS_FILE", HEADS_PATH)).read_text())
    thr = heads["thresholds"]
    # Every key, so that an option added to heads.json reaches the embedder
    # here as it reaches the server.
    cfg = dict(heads)
    # The de-obfuscated second view ("both") only adds windows for texts that
    # normalising changes beyond case; measured here on the raw view.
    if cfg["input"] == "both":
        cfg["input"] = "raw"
    sets = {name: (kind, texts, labels) for name, (kind, texts, labels) in eval_sets.load_all().items()}
    for name, n in SAMPLE.items():
        kind, texts, labels = sets[name]
        keep = sample_indices(name, len(texts))
        sets[name] = (kind, [texts[i] for i in keep], {c: [v[i] for i in keep] for c, v in labels.items()})
    sets["heldout"] = ("train split", *heldout_set())
    # MODERATO_EVAL_SETS=a,b: only those sets (e.g. the "before" figures of a
    # previous build, whose held-out split no longer exists).
    only = [s for s in os.environ.get("MODERATO_EVAL_SETS", "").split(",") if s]
    if only:
        sets = {name: v for name, v in sets.items() if name in only}

    OUT.mkdir(exist_ok=True)
    lines = [
        "# Text model evaluation" + (": the default, accurate path" if heads.get("e5") else ""),
        "",
        f"Heads `{heads['version']}` (input: {heads['input']}, chunks of up to {heads['window']['tokens']} tokens, long sentences in windows {heads['window']['stride']} apart{second_stage_words(heads)}), "
        "compared with alt-profanity-check 1.9.1 (`predict_prob`) on the same texts. "
        "AUPRC and best F1 are threshold-free; F1, recall and FPR are at the shipped thresholds "
        "(alt-profanity-check at 0.5). \"any\" = max over our categories vs. the set's any-harm label. "
        "Generated by `scripts/evaluate-text-model.sh`; label mappings are in `train/eval_sets.py` and summarised in `assets/text-model/MODEL_CARD.md`.",
        "",
    ]
    if REPORT_NAME == "fast":
        lines[-1:-1] = ["These are the fast path's heads (`speed = \"fast\"`); the default, accurate path serves "
                        "`assets/text-model/heads-e5.json`: its figures, beside these heads', are in [REPORT.md](REPORT.md)."]
    preamble = len(lines)
    before_doc = json.loads(BEFORE.read_text()) if BEFORE.exists() else {}
    before = before_doc.get("sets", {})
    if before_doc:
        # "measured": how the before figures were taken when that was not
        # this code (an older build's examples and scoring, say).
        how = f" {before_doc['measured']}" if before_doc.get("measured") else ""
        lines[-1:-1] = [f"\"before\" columns: heads `{before_doc.get('version')}` on the same texts.{how}", ""]
        preamble = len(lines)
    metrics_out = {}
    summary = []
    per_cat_ours, per_cat_prof = {}, {}
    sets = {name: v for name, v in sets.items() if v[1]}  # e.g. no dev set written yet
    for name, (kind, texts, labels) in sets.items():
        vecs, idx = embed_texts(texts, cfg, name, namespace="wide" if name != "heldout" else "train")
        S = apply_heads(cfg, vecs, idx, len(texts), lexical_features(texts), e5_if_needed(cfg, texts, name))
        flags = decide(S, np.array([thr[k] for k in CATEGORIES]), heads.get("parents", []))
        prof = profanity_scores(texts)
        lines += [f"## {name} ({kind}, {len(texts)} texts)", "",
                  "| category | n | pos | AUPRC | before | best F1 | F1@thr | before | precision@thr | recall@thr | before | FPR@thr | before | profanity-check AUPRC | its F1@0.5 | its FPR@0.5 |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for c, ys in labels.items():
            mask = np.array([v is not None for v in ys])
            if mask.sum() == 0:
                continue
            y = np.array([v for v in ys if v is not None], dtype=int)
            if c == "any":
                s = S[mask].max(axis=1)
                t_any = S[mask] >= np.array([thr[k] for k in CATEGORIES])
                s_thr = np.where(t_any.any(axis=1), 1.0, 0.0)
                m = metrics(y, s, 0.5)
                m_thr = metrics(y, s_thr, 0.5)
                m.update({k: m_thr[k] for k in ("f1", "fpr", "recall", "precision")})
            else:
                s = S[mask, CATEGORIES.index(c)]
                m = metrics(y, s, thr[c])
                m_thr = metrics(y, flags[mask, CATEGORIES.index(c)].astype(float), 0.5)
                m.update({k: m_thr[k] for k in ("f1", "fpr", "recall", "precision")})
            p = metrics(y, prof[mask], 0.5)
            b = before.get(name, {}).get(c, {})
            lines.append(f"| {c} | {m['n']} | {m['pos']} | {fmt(m['auprc'])} | {fmt(b.get('auprc'))} | {fmt(m['best_f1'])} | {fmt(m['f1'])} | {fmt(b.get('f1'))} | {fmt(m['precision'])} | {fmt(m['recall'])} | {fmt(b.get('recall'))} | {fmt(m['fpr'])} | {fmt(b.get('fpr'))} | {fmt(p['auprc'])} | {fmt(p['f1'])} | {fmt(p['fpr'])} |")
            metrics_out.setdefault(name, {})[c] = {k: (None if isinstance(m[k], float) and np.isnan(m[k]) else m[k]) for k in ("n", "pos", "auprc", "f1", "fpr", "recall", "precision")}
            if 0 < y.sum() < len(y):
                prec, rec, _ = precision_recall_curve(y, s)
                ax.plot(rec, prec, label=f"{c} ({m['auprc']:.2f})")
                if c == "any":
                    pp, pr, _ = precision_recall_curve(y, prof[mask])
                    ax.plot(pr, pp, "k--", label=f"profanity-check any ({p['auprc']:.2f})")
                if c != "any":
                    per_cat_ours.setdefault(name, []).append(m["auprc"])
                    per_cat_prof.setdefault(name, []).append(p["auprc"])
            summary.append((name, c, m, p))
        ax.set_xlabel("recall")
        ax.set_ylabel("precision")
        ax.set_title(f"{name}: precision-recall")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="lower left")
        fig.tight_layout()
        if not REPORT_NAME:
            fig.savefig(OUT / f"pr_{name}.png", dpi=90)
            lines += ["", f"![PR curves for {name}](pr_{name}.png)"]
        plt.close(fig)
        lines += [""]
        print(f"evaluate: {name} done", file=sys.stderr)

    head = ["## Summary", "",
            "| set | any AUPRC (ours) | before | any F1@thr | before | any recall@thr | before | any FPR@thr | before | mean per-category AUPRC (ours) | before | any AUPRC (profanity-check) | mean per-category (profanity-check) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in sets:
        anyrow = [(m, p) for n, c, m, p in summary if n == name and c == "any"]
        a = anyrow[0] if anyrow else ({"auprc": None}, {"auprc": None})
        mo = np.nanmean(per_cat_ours[name]) if per_cat_ours.get(name) else None
        mp = np.nanmean(per_cat_prof[name]) if per_cat_prof.get(name) else None
        ba = before.get(name, {}).get("any", {})
        bm = before.get(name, {}).get("_mean_per_category")
        head.append(f"| {name} | {fmt(a[0]['auprc'])} | {fmt(ba.get('auprc'))} | {fmt(a[0].get('f1'))} | {fmt(ba.get('f1'))} | {fmt(a[0].get('recall'))} | {fmt(ba.get('recall'))} | {fmt(a[0].get('fpr'))} | {fmt(ba.get('fpr'))} | {fmt(mo)} | {fmt(bm)} | {fmt(a[1]['auprc'])} | {fmt(mp)} |")
        if mo is not None:
            metrics_out.setdefault(name, {})["_mean_per_category"] = float(mo)
    # The held-out split changes with the training data, so the overall mean
    # is over the fixed sets (public and development) only, comparable
    # across versions.
    all_ours = [x for n, v in per_cat_ours.items() if n != "heldout" for x in v if not np.isnan(x)]
    all_prof = [x for n, v in per_cat_prof.items() if n != "heldout" for x in v if not np.isnan(x)]
    head += ["", f"Mean per-category AUPRC over the public and development sets: ours **{np.mean(all_ours):.3f}**"
             + (f" (before: {before_doc['mean_per_category']:.3f})" if "mean_per_category" in before_doc else "")
             + f", alt-profanity-check **{np.mean(all_prof):.3f}**.", "",
             HELDOUT_NOTE, ""]
    METRICS_PATH.write_text(json.dumps({"version": heads["version"], "sets": metrics_out, "mean_per_category": float(np.mean(all_ours))}, indent=1))
    report = "\n".join(lines[:preamble] + head + lines[preamble:]) + "\n"
    REPORT_PATH.write_text(report)
    print("\n".join(head))


if __name__ == "__main__":
    main()
