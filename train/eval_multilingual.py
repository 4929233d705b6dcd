"""Multilingual HateCheck (the validation half of its templates) under a
heads file, scored by the served text path itself (the `score` example:
first stage, language check, second stage), per language: hate AUPRC,
hateful cases flagged and non-hateful cases flagged at the heads'
thresholds (flagged: any category, as a response's `flagged`).

Usage: python eval_multilingual.py [HEADS.json ...] [--sample N] [--real]
  --sample N: N cases a language (seeded), for choosing between candidates
  quickly; without it every case (18,389). Scores are cached per heads file
  and text under train/out/ml_scores/.
  --real: also the held-out real texts in other languages labelled by our
  definitions (prepare.py's dataset_ml.jsonl, "test" rows of "ml:" sources;
  never fitted on): per language hate AUPRC, harmful texts flagged (any
  head positive) and clean texts flagged (every head 0)."""

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
from sklearn.metrics import average_precision_score

from common import CATEGORIES, DATASETS, ROOT, WORK, decide, examples_dir

MHC = DATASETS / "eval" / "multilingual_hatecheck" / "validation.jsonl"
SEED = 20261129


def cases(sample=None):
    rows = [json.loads(line) for line in open(MHC, encoding="utf-8")]
    if sample:
        by_lang = defaultdict(list)
        for r in rows:
            by_lang[r["lang"]].append(r)
        rows = []
        for lang in sorted(by_lang):
            group = by_lang[lang]
            random.Random(f"{SEED}:{lang}").shuffle(group)
            rows += group[:sample]
    return rows


def scores(heads_path: Path, texts):
    """(scores in CATEGORIES order, language) per text, from the cache or
    the `score` example."""
    digest = hashlib.sha256(heads_path.read_bytes()).hexdigest()[:16]
    cache_path = WORK / "ml_scores" / f"{digest}.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    missing = [t for t in dict.fromkeys(texts) if t not in cache]
    if missing:
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
            src.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in missing))
            subprocess.run([str(examples_dir() / "score"), str(heads_path), str(src), str(out)], check=True, cwd=ROOT)
            for t, line in zip(missing, open(out, encoding="utf-8")):
                d = json.loads(line)
                cache[t] = [[d["scores"][c] for c in CATEGORIES], d["language"]]
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps(cache))
    S = np.array([cache[t][0] for t in texts])
    return S, [cache[t][1] for t in texts]


def served(heads_path: Path, texts):
    """Per text: flagged (any category, as served), the hate score, and the
    language named; and the heads' version."""
    heads = json.loads(heads_path.read_text())
    thr = np.array([heads["thresholds"][c] for c in CATEGORIES])
    S, langs = scores(heads_path, texts)
    flagged = decide(S, thr, heads.get("parents", [])).any(axis=1)
    return flagged, S[:, CATEGORIES.index("hate")], langs, heads["version"]


def report(heads_path: Path, rows):
    flagged, hate, langs, version = served(heads_path, [r["text"] for r in rows])
    y = np.array([r["label"] == "hateful" for r in rows])
    out = {}
    for lang in sorted({r["lang"] for r in rows}) + ["all"]:
        m = np.array([lang == "all" or r["lang"] == lang for r in rows])
        detected = [l for l, k in zip(langs, m) if k]
        out[lang] = {
            "n": int(m.sum()),
            "hate_auprc": round(float(average_precision_score(y[m], hate[m])), 3),
            "hateful_flagged": round(float(flagged[m & y].mean()), 3),
            "non_hateful_flagged": round(float(flagged[m & ~y].mean()), 3),
            "detected_as_lang": round(sum(d == lang for d in detected) / max(len(detected), 1), 3),
            "unsure": round(sum(d is None for d in detected) / max(len(detected), 1), 3),
        }
    langs_only = [k for k in out if k != "all"]
    out["mean"] = {k: round(float(np.mean([out[l][k] for l in langs_only])), 3)
                   for k in ("hate_auprc", "hateful_flagged", "non_hateful_flagged")}
    return version, out


def real_rows():
    path = WORK / "dataset_ml.jsonl"
    if not path.exists():
        sys.exit("train/out/dataset_ml.jsonl is missing: run prepare.py")
    rows = [r for r in map(json.loads, open(path, encoding="utf-8"))
            if r["split"] == "test" and r["source"].startswith("ml:")]
    # MODERATO_HELDOUT_ALSO=an earlier dataset_ml.jsonl: only the texts held
    # out in both, so that heads fitted on that one's rows are compared on
    # texts neither saw (prepare.py's split moves when rows are added).
    earlier = os.environ.get("MODERATO_HELDOUT_ALSO")
    if earlier:
        held = {r["text"] for r in map(json.loads, open(earlier, encoding="utf-8")) if r["split"] == "test"}
        rows = [r for r in rows if r["text"] in held]
    return rows


def real_report(heads_path: Path, rows):
    """Held-out real rows: per language (and all) hate AUPRC, harmful and
    clean texts flagged at the heads' thresholds."""
    flagged, hate, _, version = served(heads_path, [r["text"] for r in rows])
    y_hate = np.array([r["labels"].get("hate") == 1 for r in rows])
    harmful = np.array([any(v == 1 for k, v in r["labels"].items() if k != "minor") for r in rows])
    clean = np.array([all(v == 0 for k, v in r["labels"].items() if k != "minor") for r in rows])
    print(f"## {heads_path.name} ({version}), {len(rows)} held-out real texts\n")
    print("| language | n | hate AUPRC | harmful flagged | clean flagged |")
    print("|---|---|---|---|---|")
    for lang in sorted({r["lang"] for r in rows}) + ["all"]:
        m = np.array([lang == "all" or r["lang"] == lang for r in rows])
        ap = average_precision_score(y_hate[m], hate[m]) if y_hate[m].any() else float("nan")
        print(f"| {lang} | {int(m.sum())} | {ap:.3f} | {flagged[m & harmful].mean():.1%} | {flagged[m & clean].mean():.1%} |")
    print()


def main():
    args = sys.argv[1:]
    real = "--real" in args
    if real:
        args.remove("--real")
    sample = None
    if "--sample" in args:
        i = args.index("--sample")
        sample = int(args[i + 1])
        del args[i : i + 2]
    paths = [Path(a).resolve() for a in args] or [ROOT / "assets" / "text-model" / "heads-e5.json"]
    rows = cases(sample)
    for path in paths:
        version, out = report(path, rows)
        print(f"## {path.name} ({version}), {len(rows)} cases\n")
        print("| language | n | hate AUPRC | hateful flagged | non-hateful flagged | detected as it | unsure |")
        print("|---|---|---|---|---|---|---|")
        for lang, m in out.items():
            if lang == "mean":
                continue
            print(f"| {lang} | {m['n']} | {m['hate_auprc']:.3f} | {m['hateful_flagged']:.1%} | "
                  f"{m['non_hateful_flagged']:.1%} | {m['detected_as_lang']:.1%} | {m['unsure']:.1%} |")
        mean = out["mean"]
        print(f"| mean of languages | | {mean['hate_auprc']:.3f} | {mean['hateful_flagged']:.1%} | "
              f"{mean['non_hateful_flagged']:.1%} | | |\n")
        (WORK / "ml_reports").mkdir(parents=True, exist_ok=True)
        (WORK / "ml_reports" / f"{path.stem}-{sample or 'all'}.json").write_text(json.dumps(out, indent=1))
        if real:
            real_report(path, real_rows())


if __name__ == "__main__":
    main()
