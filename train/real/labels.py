"""Reading, checking and merging the labelling passes.

A pass file is `id<TAB>codes` per line (GUIDE.md). `python labels.py check
BATCH PASSFILE` says whether a pass covers its batch exactly with valid codes."""

import json
import sys

CODES = {
    "H": "harassment",
    "HT": "harassment/threatening",
    "HA": "hate",
    "HAT": "hate/threatening",
    "SH": "self-harm",
    "SHI": "self-harm/intent",
    "SHN": "self-harm/instructions",
    "S": "sexual",
    "V": "violence",
    "VG": "violence/graphic",
    "M": "minor",
}
PARENT = {"HT": "H", "HAT": "HA", "SHI": "SH", "SHN": "SH", "VG": "V"}


def parse_codes(field):
    """codes -> {head: 1 | 0 | None}; a child implies its parent."""
    labels = {h: 0 for h in CODES.values()}
    for tok in field.split():
        unknown = tok.startswith("?")
        code = tok.lstrip("?").upper()
        if code not in CODES:
            raise ValueError(f"unknown code {tok!r}")
        head = CODES[code]
        if unknown:
            if labels[head] != 1:
                labels[head] = None
        else:
            labels[head] = 1
            if code in PARENT:
                labels[CODES[PARENT[code]]] = 1
    return labels


def read_pass(path):
    out = {}
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        id_, _, codes = line.partition("\t")
        out[id_.strip()] = parse_codes(codes)
    return out


def check(batch, passfile):
    ids = [json.loads(l)["id"] for l in open(batch, encoding="utf-8")]
    try:
        got = read_pass(passfile)
    except ValueError as e:
        return f"{passfile}: {e}"
    missing = [i for i in ids if i not in got]
    extra = [i for i in got if i not in set(ids)]
    if missing or extra:
        return f"{passfile}: {len(missing)} ids missing (first {missing[:3]}), {len(extra)} unknown (first {extra[:3]})"
    return None


if __name__ == "__main__":
    if sys.argv[1] == "check":
        problem = check(sys.argv[2], sys.argv[3])
        print(problem or f"ok: {sys.argv[3]} covers {sys.argv[2]}")
        sys.exit(1 if problem else 0)


HEADS = list(CODES.values())
BACK = {v: k for k, v in CODES.items()}


def _dirs():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "out" / "labelling"
    return root / "batches", root / "passA", root / "passB", root / "passC"


def cohen_kappa(a, b):
    """Cohen's kappa of two 0/1 lists (None where both could not be compared)."""
    n = len(a)
    if n == 0:
        return float("nan")
    po = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(a) / n, sum(b) / n
    pe = pa * pb + (1 - pa) * (1 - pb)
    return float("nan") if pe == 1 else (po - pe) / (1 - pe)


def paired(batches):
    """(id, batch name, A labels, B labels) for every text of batches with both passes."""
    bdir, adir, bpdir, _ = _dirs()
    out = []
    for name in batches:
        a, b = read_pass(adir / f"{name}.tsv"), read_pass(bpdir / f"{name}.tsv")
        for line in open(bdir / f"{name}.jsonl", encoding="utf-8"):
            id_ = json.loads(line)["id"]
            out.append((id_, name, a[id_], b[id_]))
    return out


# `--ml`: the multilingual batches (`*_ml_*`, pool_multilingual.py), their
# disputed texts (`disputed_ml_*`) and their labels file; without it, the
# English ones. The two never mix, so merging one cannot drop the other.
ML = "--ml" in sys.argv
DISPUTED = "disputed_ml_" if ML else "disputed_"


def _is_disputed(stem):
    return stem.startswith(DISPUTED) and (ML or not stem.startswith("disputed_ml_"))


def _in_scope(stem):
    return ("_ml_" in stem) == ML and not stem.startswith("disputed_")


def complete_batches():
    bdir, adir, bpdir, _ = _dirs()
    names = sorted(p.stem for p in bdir.glob("*.jsonl") if _in_scope(p.stem))
    return [n for n in names if (adir / f"{n}.tsv").exists() and (bpdir / f"{n}.tsv").exists()
            and not check(bdir / f"{n}.jsonl", adir / f"{n}.tsv") and not check(bdir / f"{n}.jsonl", bpdir / f"{n}.tsv")]


def agreement(pairs):
    """Per head: kappa, texts compared, positives in A and in B."""
    out = {}
    for h in HEADS:
        both = [(a[h], b[h]) for _, _, a, b in pairs if a[h] is not None and b[h] is not None]
        out[h] = {
            "kappa": round(cohen_kappa([x for x, _ in both], [y for _, y in both]), 3),
            "n": len(both),
            "pos_a": sum(x for x, _ in both),
            "pos_b": sum(y for _, y in both),
        }
    return out


def disagreements(pairs):
    return [(id_, name) for id_, name, a, b in pairs if any(a[h] != b[h] for h in HEADS)]


def write_third_pass_batches(pairs):
    """Batches of the texts the two passes disagree on, for a third, blind pass."""
    bdir, _, _, _ = _dirs()
    texts = {}
    for name in {n for _, n, _, _ in pairs}:
        for line in open(bdir / f"{name}.jsonl", encoding="utf-8"):
            d = json.loads(line)
            texts[d["id"]] = d
    todo = disagreements(pairs)
    done = set()
    disputed = [p for p in bdir.glob("disputed_*.jsonl") if _is_disputed(p.stem)]
    for p in disputed:
        done |= {json.loads(l)["id"] for l in open(p, encoding="utf-8")}
    todo = [t for t in todo if t[0] not in done]
    n0 = len(disputed)
    for k in range(0, len(todo), 300):
        with open(bdir / f"{DISPUTED}{n0 + k // 300:03d}.jsonl", "w", encoding="utf-8") as f:
            for id_, _ in todo[k : k + 300]:
                f.write(json.dumps(texts[id_], ensure_ascii=False) + "\n")
    return len(todo)


def decide(pairs):
    """Final labels: where A and B agree on a head, theirs; where they do not,
    the third pass's (None when it has none yet or could not decide)."""
    bdir, _, _, cdir = _dirs()
    third = {}
    for p in (p for p in bdir.glob("disputed_*.jsonl") if _is_disputed(p.stem)):
        pc = cdir / f"{p.stem}.tsv"
        if pc.exists() and not check(p, pc):
            third.update(read_pass(pc))
    out = []
    for id_, name, a, b in pairs:
        labels, passes = {}, 2
        for h in HEADS:
            if a[h] == b[h]:
                labels[h] = a[h]
            elif id_ in third:
                labels[h], passes = third[id_][h], 3
            else:
                labels[h] = "undecided"
        # A child's positive implies its parent's.
        for child, parent in PARENT.items():
            if labels[CODES[child]] == 1 and labels[CODES[parent]] in (0, None):
                labels[CODES[parent]] = 1
        out.append({"id": id_, "labels": labels, "passes": passes})
    return out


if __name__ == "__main__" and sys.argv[1] in ("agreement", "disputed", "merge"):
    from pathlib import Path

    pairs = paired(complete_batches())
    if sys.argv[1] == "agreement":
        print(json.dumps(agreement(pairs), indent=1))
        print(f"{len(pairs)} texts, {len(disagreements(pairs))} with any disagreement")
    elif sys.argv[1] == "disputed":
        print(f"{write_third_pass_batches(pairs)} new disputed texts")
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        if ML:
            from pool_multilingual import LICENCES
        else:
            from pool import LICENCES

        rows = decide(pairs)
        undecided = [r for r in rows if "undecided" in r["labels"].values()]
        name = "real_labels_multilingual.jsonl" if ML else "real_labels.jsonl"
        out = Path(__file__).resolve().parent.parent / "data" / name
        # train/out is not committed: a new machine holds only this session's
        # passes, so the file's labels for other texts are kept as they are.
        new = [{"id": r["id"], "source": r["id"].split(":")[0], "licence": LICENCES[r["id"].split(":")[0]],
                "passes": r["passes"], "labels": r["labels"]} for r in rows if r not in undecided]
        # A text put in two batches (two rounds drew it) is labelled twice:
        # the first batch's labels stand, as prepare.py would read them.
        first = {}
        for r in new:
            first.setdefault(r["id"], r)
        new = list(first.values())
        earlier = [json.loads(line) for line in open(out, encoding="utf-8")] if out.exists() else []
        now = {r["id"] for r in new}
        kept = [e for e in earlier if e["id"] not in now]
        with open(out, "w", encoding="utf-8") as f:
            for r in sorted(kept + new, key=lambda r: r["id"]):
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        print(f"wrote {len(kept) + len(new)} labelled texts to {out} ({len(kept)} kept from earlier passes); "
              f"{len(undecided)} wait for a third pass")
