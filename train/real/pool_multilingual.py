"""The pool of real texts in other languages to label by our definitions, read
from ../shared/datasets/train/multilingual (never copied into the repository:
labels name each text by a stable id, and training joins them back here).

Ids: cold_zh:{split}:{row id}, swsr_zh:{index}, told_pt:{row}, kohate_ko:{split}:{row},
kocurse_ko:{line}, germeval_de:{split}:{line}, mlma_fr:{HITId}, mlma_ar:{HITId}.

The sources' own labels are used for one thing only: to draw a batch with
enough of what the source calls offensive, since most real text is harmless
and a uniform draw would teach the heads little about harm. The labellers
never see them; the labels we train on are ours (GUIDE.md).

`python pool_multilingual.py batches SOURCE N` writes N texts of SOURCE (half
drawn from what the source marks offensive, half from the rest) to
train/out/labelling/batches/SOURCE_ml_NNN.jsonl in batches of BATCH."""

import csv
import json
import random
import re
import sys
import unicodedata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import DATASETS, WORK  # noqa: E402

ML = DATASETS / "train" / "multilingual"
SEED = 20261129
BATCH = 150
LICENCES = {
    "cold_zh": "Apache-2.0",
    "swsr_zh": "MIT",
    "told_pt": "CC-BY-SA-4.0",
    "kohate_ko": "CC-BY-SA-4.0",
    "kocurse_ko": "MIT",
    "germeval_de": "CC-BY-4.0",
    "mlma_fr": "MIT",
    "mlma_ar": "MIT",
}
LANGUAGE = {
    "cold_zh": "zh", "swsr_zh": "zh", "told_pt": "pt", "kohate_ko": "ko",
    "kocurse_ko": "ko", "germeval_de": "de", "mlma_fr": "fr", "mlma_ar": "ar",
}


def key(text: str) -> str:
    """Duplicate key for any script: NFKC, lower case, mentions and links
    dropped, letters and digits of every script kept (common.dedup_key keeps
    a-z only, which would make every Chinese text one empty key)."""
    t = unicodedata.normalize("NFKC", text).lower()
    t = re.sub(r"@\w+|https?://\S+|&amp;|\brt\b|@url|@user", " ", t)
    t = re.sub(r"[\W_]+", " ", t)
    return t.strip()


def _csv(path, **kw):
    return csv.DictReader(open(path, encoding="utf-8-sig", errors="replace", newline=""), **kw)


def cold_zh():
    for split in ("train", "dev", "test"):
        for r in _csv(ML / "cold_zh" / f"{split}.csv"):
            yield f"cold_zh:{split}:{r['']}", r["TEXT"], r["label"] == "1"


def swsr_zh():
    for r in _csv(ML / "swsr_zh" / "SexComment.csv"):
        yield f"swsr_zh:{r['index']}", r["comment_text"], r["label"] == "1"


def told_pt():
    heads = ("homophobia", "obscene", "insult", "racism", "misogyny", "xenophobia")
    for i, r in enumerate(_csv(ML / "told_br_pt" / "ToLD-BR.csv")):
        yield f"told_pt:{i}", r["text"], any(float(r[h] or 0) >= 2 for h in heads)


def kohate_ko():
    for split in ("train", "dev"):
        for i, r in enumerate(_csv(ML / "korean_hate_speech_ko" / f"{split}.tsv", delimiter="\t")):
            yield f"kohate_ko:{split}:{i}", r["comments"], r["hate"] != "none"


def kocurse_ko():
    for i, line in enumerate(open(ML / "korean_curse_ko" / "dataset.txt", encoding="utf-8", errors="replace")):
        text, sep, flag = line.rstrip("\n").rpartition("|")
        if sep:
            yield f"kocurse_ko:{i}", text, flag.strip() == "1"


def germeval_de():
    for split in ("training", "test"):
        path = ML / "germeval2018_de" / f"germeval2018.{split}.txt"
        for i, line in enumerate(open(path, encoding="utf-8", errors="replace")):
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 2:
                yield f"germeval_de:{split}:{i}", parts[0], parts[1] == "OFFENSE"


def mlma(lang):
    def rows():
        for r in _csv(ML / "mlma_fr_ar" / f"{lang}_dataset.csv"):
            yield f"mlma_{lang}:{r['HITId']}", r["tweet"], r["sentiment"] != "normal"

    return rows


SOURCES = {
    "cold_zh": cold_zh, "swsr_zh": swsr_zh, "told_pt": told_pt, "kohate_ko": kohate_ko,
    "kocurse_ko": kocurse_ko, "germeval_de": germeval_de, "mlma_fr": mlma("fr"), "mlma_ar": mlma("ar"),
}


def banned_keys():
    """Keys of every multilingual validation text: none may be labelled for training."""
    path = DATASETS / "eval" / "multilingual_hatecheck" / "validation.jsonl"
    out = set()
    for line in open(path, encoding="utf-8"):
        d = json.loads(line)
        out.add(key(d.get("text") or d.get("test_case") or ""))
    return out


def texts(source):
    """(id, text, source says offensive) of one source: empty texts,
    in-source duplicates and copies of a validation text dropped."""
    banned, seen = banned_keys(), set()
    for id_, text, flag in SOURCES[source]():
        text = (text or "").strip()
        k = key(text)
        if not k or k in banned or k in seen:
            continue
        seen.add(k)
        yield id_, text, flag


def all_texts():
    """id -> text over every multilingual source (for joining labels back)."""
    return {id_: text for s in SOURCES for id_, text, _ in texts(s)}


def draw(source, n):
    rows = list(texts(source))
    rng = random.Random(f"{SEED}:{source}")
    pos = [r for r in rows if r[2]]
    neg = [r for r in rows if not r[2]]
    rng.shuffle(pos)
    rng.shuffle(neg)
    take = min(len(pos), n // 2)
    picked = pos[:take] + neg[: n - take]
    rng.shuffle(picked)
    return picked


def labelled_ids():
    path = Path(__file__).resolve().parent.parent / "data" / "real_labels_multilingual.jsonl"
    if not path.exists():
        return set()
    return {json.loads(line)["id"] for line in open(path, encoding="utf-8")}


def write_batches(source, n):
    """The first `n` of the source's draw (a larger `n` draws a superset of
    a smaller one), less the texts already labelled, in batches numbered
    after the source's existing ones."""
    out = WORK / "labelling" / "batches"
    out.mkdir(parents=True, exist_ok=True)
    done = labelled_ids()
    picked = [r for r in draw(source, n) if r[0] not in done]
    first = len(list(out.glob(f"{source}_ml_*.jsonl")))
    for b in range(0, len(picked), BATCH):
        with open(out / f"{source}_ml_{first + b // BATCH:03d}.jsonl", "w", encoding="utf-8") as f:
            for id_, text, _ in picked[b : b + BATCH]:
                f.write(json.dumps({"id": id_, "text": text, "lang": LANGUAGE[source]}, ensure_ascii=False) + "\n")
    print(f"{source}: {len(picked)} texts in {(len(picked) + BATCH - 1) // BATCH} batches")


if __name__ == "__main__":
    if sys.argv[1] == "batches":
        write_batches(sys.argv[2], int(sys.argv[3]))
