"""English evaluation sets scored by the served text path itself (the
`score` example, as eval_multilingual.py does): with heads for other
languages the route a text takes depends on its language, which
evaluate.py's replay of the heads in Python does not model. Per set:
any-category AUPRC, mean per-category AUPRC, and flagged F1, recall and
false-positive rate at the heads' thresholds (flagged: any category, as a
response's `flagged`).

Usage: python eval_served.py HEADS.json [HEADS.json ...] [--sets validation,hatecheck,...]"""

import json
import sys
from pathlib import Path

import numpy as np
from sklearn.metrics import average_precision_score

import eval_sets
from common import CATEGORIES, decide
from eval_multilingual import scores


def figures(heads_path: Path, texts, labels):
    heads = json.loads(heads_path.read_text())
    S, _ = scores(heads_path, texts)
    thr = np.array([heads["thresholds"][c] for c in CATEGORIES])
    flagged = decide(S, thr, heads.get("parents", [])).any(axis=1)
    out = {}
    per_cat = []
    for c, ys in labels.items():
        mask = np.array([v is not None for v in ys])
        y = np.array([v for v in ys if v is not None], dtype=int)
        if not 0 < y.sum() < len(y):
            continue
        s = S[mask].max(axis=1) if c == "any" else S[mask, CATEGORIES.index(c)]
        ap = float(average_precision_score(y, s))
        if c == "any":
            f = flagged[mask]
            tp, fp, fn = int((f & (y == 1)).sum()), int((f & (y == 0)).sum()), int((~f & (y == 1)).sum())
            out.update(any_auprc=round(ap, 3), f1=round(2 * tp / max(2 * tp + fp + fn, 1), 3),
                       recall=round(tp / max(tp + fn, 1), 3), fpr=round(fp / max(int((y == 0).sum()), 1), 3))
        else:
            per_cat.append(ap)
    if per_cat:
        out["per_category_auprc"] = round(float(np.mean(per_cat)), 3)
    return out


def main():
    args = sys.argv[1:]
    names = ["validation", "hatecheck"]
    if "--sets" in args:
        i = args.index("--sets")
        names = args[i + 1].split(",")
        del args[i : i + 2]
    loaders = {"validation": eval_sets.validation, "hatecheck": eval_sets.hatecheck, "toxicchat": eval_sets.toxicchat,
               "ailuminate": eval_sets.ailuminate}
    for name in names:
        texts, labels = loaders[name]()
        for path in map(lambda a: Path(a).resolve(), args):
            print(name, path.name, json.dumps(figures(path, texts, labels)))


if __name__ == "__main__":
    main()
