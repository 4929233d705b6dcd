"""The written corpus (train/data/written_*.jsonl) and the development set
(train/dev/*.jsonl): checks every row, stores labels as an explicit value
for every head, drops exact duplicates, and prints the counts the data card
reports.

A row: {"text", "labels": {head: 1 | 0 | null}, "form", "kind"}.
Writers may hand in `labels` as a list of the heads that apply (plus an
optional `unknown` list); this script rewrites such rows in the explicit
form: listed heads 1, `unknown` heads null, every other head 0. A parent is
set to 1 whenever a child is.

Usage: python corpus.py [FILE ...]  (normalise and report, in place; FILEs: only those)
       python corpus.py --check       (report only; exit 1 on a bad row)"""

import json
import sys
from collections import Counter
from pathlib import Path

from common import HEADS, PARENTS, ROOT, dedup_key

DATA = ROOT / "train" / "data"
DEV = ROOT / "train" / "dev"
FORMS = {"chat", "comment", "social", "assistant_prompt", "story", "news", "long", "review", "email", "other"}
KINDS = {"positive", "hard_negative", "ordinary", "minor_signal"}
HARMS = [h for h in HEADS if h != "minor"]


class BadRow(ValueError):
    pass


def explicit_labels(row: dict) -> dict:
    labels = row["labels"]
    if isinstance(labels, dict):
        out = {h: labels.get(h, 0) for h in HEADS}
    else:
        unknown = set(row.get("unknown", []))
        bad = (set(labels) | unknown) - set(HEADS)
        if bad:
            raise BadRow(f"unknown label(s) {sorted(bad)}")
        out = {h: 1 if h in labels else (None if h in unknown else 0) for h in HEADS}
    for child, parent in PARENTS:
        if out[child] == 1:
            out[parent] = 1
    for h, v in out.items():
        if v not in (0, 1, None):
            raise BadRow(f"label {h} must be 1, 0 or null, not {v!r}")
    if out["minor"] == 1 and out["sexual"] == 1:
        raise BadRow("a row may never be both sexual and about a minor")
    return out


def kind_of(labels: dict) -> str:
    if any(labels[h] == 1 for h in HARMS):
        return "positive"
    return "minor_signal" if labels["minor"] == 1 else "hard_negative"


def clean(row: dict) -> dict:
    text = row.get("text")
    if not isinstance(text, str) or not text.strip():
        raise BadRow("text missing or empty")
    labels = explicit_labels(row)
    form = row.get("form", "other")
    if form not in FORMS:
        form = "other"
    kind = kind_of(labels)
    if kind == "hard_negative" and row.get("kind") == "ordinary":
        kind = "ordinary"  # harmless text with no alarming vocabulary (the dev set's plain traffic)
    out = {"text": text.strip(), "labels": labels, "form": form, "kind": kind}
    if isinstance(row.get("type"), str):
        out["type"] = row["type"]  # the kind of safe prompt (homonym, figurative, ...)
    return out


def load(path: Path, seen: set, stats: Counter):
    rows = []
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if not line.strip():
            continue
        try:
            r = clean(json.loads(line))
        except (json.JSONDecodeError, BadRow, KeyError) as e:
            stats["bad"] += 1
            print(f"{path.name}:{n}: {e}", file=sys.stderr)
            continue
        k = dedup_key(r["text"])
        if k in seen:
            stats["duplicates"] += 1
            continue
        seen.add(k)
        rows.append(r)
    return rows


def report(name: str, rows: list):
    kinds = Counter(r["kind"] for r in rows)
    forms = Counter(r["form"] for r in rows)
    pos = Counter(h for r in rows for h, v in r["labels"].items() if v == 1)
    words = sorted(len(r["text"].split()) for r in rows)
    median = words[len(words) // 2] if words else 0
    print(f"## {name}: {len(rows)} rows, median {median} words, {sum(w > 40 for w in words)} over 40 words")
    print("kinds:", dict(kinds))
    print("positives per head:", {h: pos[h] for h in HEADS})
    print("forms:", dict(forms.most_common()))


def main():
    check = "--check" in sys.argv
    stats = Counter()
    groups = {"corpus": sorted(DATA.glob("written_*.jsonl")), "dev": sorted(DEV.glob("*.jsonl"))}
    only = {Path(a).resolve() for a in sys.argv[1:] if not a.startswith("--")}
    if only:
        groups = {name: [p for p in paths if p.resolve() in only] for name, paths in groups.items()}
    # Duplicates are dropped within each group; overlap between the corpus and
    # the development set is dropped from the corpus by train_heads.py.
    for name, paths in groups.items():
        seen, everything = set(), []
        for path in paths:
            rows = load(path, seen, stats)
            everything += rows
            if not check:
                with open(path, "w", encoding="utf-8") as f:
                    for r in rows:
                        f.write(json.dumps(r, ensure_ascii=False) + "\n")
        report(name, everything)
    print(f"bad rows: {stats['bad']}, exact duplicates dropped: {stats['duplicates']}")
    if check and stats["bad"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
