"""The data card's figures for the real labelled texts: label counts per head
and source, agreement between the blind passes (Cohen's kappa per head), and
agreement of our final labels with each source's own labels where it has
them. Prints Markdown (`python report.py > /tmp/card.md`)."""

import csv
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from labels import HEADS, agreement, cohen_kappa, complete_batches, paired  # noqa: E402
from pool import TRAIN  # noqa: E402

REAL = Path(__file__).resolve().parent.parent / "data" / "real_labels.jsonl"


def any_of(labels, heads):
    return int(any(labels.get(h) == 1 for h in heads))


def convabuse_source():
    """id -> 1 when most of its annotators called it abusive (-1..-3)."""
    out = {}
    for split in ("train", "valid", "test"):
        for r in csv.DictReader(open(TRAIN / "convabuse" / f"ConvAbuseEMNLP{split}.csv", encoding="utf-8")):
            votes = []
            for k in range(1, 9):
                cells = {v: r.get(f"Annotator{k}_is_abuse.{v}", "") for v in ("1", "0", "-1", "-2", "-3")}
                if not any(c.strip() for c in cells.values()):
                    continue
                abusive = any("1" in cells[v] for v in ("-1", "-2", "-3"))
                votes.append(abusive)
            if votes:
                out[f"convabuse:{split}:{r['example_id']}"] = int(sum(votes) * 2 > len(votes))
    return out


def davidson_source():
    out = {}
    for r in csv.DictReader(open(TRAIN / "davidson_labeled_data.csv", encoding="utf-8", errors="replace")):
        out[f"davidson:{r['']}"] = int(r["class"])
    return out


def toxic_spans_source():
    """comment id -> span types that at least two annotators marked."""
    ann_comment = {}
    for r in csv.DictReader(open(TRAIN / "toxic_spans" / "data_annotations.csv", encoding="utf-8")):
        ann_comment[r["annotation"]] = (r["comment_id"], r["worker"])
    workers = defaultdict(lambda: defaultdict(set))
    for r in csv.DictReader(open(TRAIN / "toxic_spans" / "data_spans.csv", encoding="utf-8")):
        cid, worker = ann_comment.get(r["annotation"], (None, None))
        if cid:
            workers[cid][r["type"]].add(worker)
    return {f"toxic_spans:{cid}": {t for t, w in types.items() if len(w) >= 2} for cid, types in workers.items()}


def main():
    rows = [json.loads(l) for l in open(REAL, encoding="utf-8")]
    by_source = defaultdict(list)
    for r in rows:
        by_source[r["source"]].append(r)

    print("### Label counts (final labels; 1 / known)\n")
    print("| head | " + " | ".join(sorted(by_source)) + " | all |")
    print("|---|" + "---|" * (len(by_source) + 1))
    for h in HEADS:
        cells = []
        for s in sorted(by_source) + [None]:
            rs = rows if s is None else by_source[s]
            pos = sum(1 for r in rs if r["labels"][h] == 1)
            known = sum(1 for r in rs if r["labels"][h] is not None)
            cells.append(f"{pos} / {known}")
        print(f"| {h} | " + " | ".join(cells) + " |")
    passes = Counter(r["passes"] for r in rows)
    print(f"\n{len(rows)} texts; {passes[3]} went to a third pass.\n")

    pairs = paired(complete_batches())
    print("### Agreement between the two blind passes (Cohen's kappa)\n")
    print("| head | kappa | texts | positives, pass A / B |")
    print("|---|---|---|---|")
    for h, a in agreement(pairs).items():
        print(f"| {h} | {a['kappa']} | {a['n']} | {a['pos_a']} / {a['pos_b']} |")

    print("\n### Agreement with the sources' own labels\n")
    print("| source | their label | ours | texts | kappa | ours positive when theirs is / is not |")
    print("|---|---|---|---|---|---|")

    def compare(name, theirs_name, ours_name, pairs_):
        if not pairs_:
            return
        a = [t for t, _ in pairs_]
        b = [o for _, o in pairs_]
        pos = [o for t, o in pairs_ if t]
        neg = [o for t, o in pairs_ if not t]
        rate = lambda xs: f"{sum(xs) / len(xs):.2f}" if xs else "–"  # noqa: E731
        print(f"| {name} | {theirs_name} | {ours_name} | {len(a)} | {cohen_kappa(a, b):.3f} | {rate(pos)} / {rate(neg)} |")

    ca = convabuse_source()
    compare("ConvAbuse", "abusive (annotator majority)", "harassment, hate or sexual",
            [(ca[r["id"]], any_of(r["labels"], ("harassment", "hate", "sexual"))) for r in by_source["convabuse"] if r["id"] in ca])
    dv = davidson_source()
    dav = [r for r in by_source["davidson"] if r["id"] in dv]
    compare("Davidson", "hate (class 0)", "hate", [(int(dv[r["id"]] == 0), any_of(r["labels"], ("hate",))) for r in dav])
    compare("Davidson", "hate or offensive (class 0, 1)", "harassment or hate",
            [(int(dv[r["id"]] != 2), any_of(r["labels"], ("harassment", "hate"))) for r in dav])
    ts = toxic_spans_source()
    tsr = [r for r in by_source["toxic_spans"] if r["id"] in ts]
    for typ, heads in (("Insult", ("harassment",)), ("Identity based Attack", ("hate",)), ("Threat", ("harassment/threatening", "violence"))):
        compare("Toxic Spans", f"{typ} (≥ 2 annotators)", " or ".join(heads),
                [(int(typ in ts[r["id"]]), any_of(r["labels"], heads)) for r in tsr])


if __name__ == "__main__":
    main()
