"""The pool of real texts to label by our definitions, read from
../shared/datasets/train (never copied into the repository: the labels in
train/data/real_labels.jsonl name each text by a stable id, and training joins
them back to the text here).

Ids: convabuse:{split}:{example_id}, toxic_spans:{comment_id},
davidson:{row}, hh:{line} (the first human turn of harmless-base_test line N),
hhturn:{line}:{k} (its k-th human turn, k >= 1), convprev:{split}:{example_id}
(ConvAbuse's user turn before that row's).

`python pool.py batches SOURCE SIZE` writes unlabelled batches to
train/out/labelling/batches/ for the labelling passes (text and, for chat
turns, the previous turns as context; never the source's own labels)."""

import csv
import gzip
import json
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import DATASETS, WORK, dedup_key  # noqa: E402

TRAIN = DATASETS / "train"
LICENCES = {
    "convabuse": "CC-BY-4.0",
    "toxic_spans": "CC0-1.0",
    "davidson": "MIT",
    "hh": "MIT",
    "hhturn": "MIT",
    "convprev": "CC-BY-4.0",
}
SEED = 20261125


def _convabuse_rows():
    """(split, row) over ConvAbuse's three splits. A row is four turns in
    order: prev_agent, prev_user, agent, user."""
    for split in ("train", "valid", "test"):
        path = TRAIN / "convabuse" / f"ConvAbuseEMNLP{split}.csv"
        for r in csv.DictReader(open(path, encoding="utf-8", errors="replace")):
            yield split, r


def convabuse():
    for split, r in _convabuse_rows():
        context = _turns([("bot", r["prev_agent"]), ("user", r["prev_user"]), ("bot", r["agent"])])
        yield f"convabuse:{split}:{r['example_id']}", r["user"], context


def _turns(turns):
    """The turns that hold text ("_" and "nan" mark a turn that was not there)."""
    return [(who, t.strip()) for who, t in turns if t and t.strip() not in ("", "_", "nan")]


def convabuse_previous():
    """The user turn before each labelled one (prev_user): the same people's
    writing, labelled in its own right, with the bot turn before it as context.
    Id convprev:{split}:{example_id} (the row it is read from)."""
    for split, r in _convabuse_rows():
        if _turns([("user", r["prev_user"])]):
            yield f"convprev:{split}:{r['example_id']}", r["prev_user"], _turns([("bot", r["prev_agent"])])


def toxic_spans():
    path = TRAIN / "toxic_spans" / "data_comments.csv"
    for r in csv.DictReader(open(path, encoding="utf-8", errors="replace")):
        yield f"toxic_spans:{r['comment_id']}", r["comment_text"], []


def davidson():
    path = TRAIN / "davidson_labeled_data.csv"
    for r in csv.DictReader(open(path, encoding="utf-8", errors="replace")):
        yield f"davidson:{r['']}", r["tweet"], []


HUMAN = re.compile(r"\n\nHuman: (.*?)(?=\n\nAssistant:|\Z)", re.S)


def hh():
    with gzip.open(TRAIN / "hh_rlhf" / "harmless-base_test.jsonl.gz", "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            m = HUMAN.search(json.loads(line)["chosen"])
            if m:
                yield f"hh:{i}", m.group(1), []


TURN = re.compile(r"\n\n(Human|Assistant): (.*?)(?=\n\n(?:Human|Assistant):|\Z)", re.S)
# How much of a conversation a later turn's labeller sees: enough to tell what
# "yes, do it" answers, not the whole red-team dialogue.
CONTEXT_TURNS, CONTEXT_CHARS = 4, 400


def hh_turns():
    """The second and later human turns of harmless-base_test: red-team requests
    that escalate (violence, self-harm, harassment), the weak heads of #54.
    Id hhturn:{line}:{k}, k the human turn's index from 0; the earlier turns
    (shortened) are the context."""
    with gzip.open(TRAIN / "hh_rlhf" / "harmless-base_test.jsonl.gz", "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            turns = [(who, t.strip()) for who, t in TURN.findall(json.loads(line)["chosen"])]
            k = 0
            for n, (who, text) in enumerate(turns):
                if who != "Human":
                    continue
                if k > 0:
                    context = [("user" if w == "Human" else "bot", t[:CONTEXT_CHARS]) for w, t in turns[:n]]
                    yield f"hhturn:{i}:{k}", text, context[-CONTEXT_TURNS:]
                k += 1


SOURCES = {"convabuse": convabuse, "toxic_spans": toxic_spans, "davidson": davidson, "hh": hh, "hhturn": hh_turns,
           "convprev": convabuse_previous}


def validation_keys():
    path = DATASETS / "eval" / "openai_moderation" / "validation_half.jsonl"
    return {dedup_key(json.loads(l)["prompt"]) for l in open(path, encoding="utf-8")}


def texts(source):
    """(id, text, context) of one source, empty texts, in-source duplicates and
    copies of a validation text dropped."""
    banned, seen = validation_keys(), set()
    for id_, text, context in SOURCES[source]():
        text = (text or "").strip()
        k = dedup_key(text)
        if not k or k in banned or k in seen:
            continue
        seen.add(k)
        yield id_, text, context


def all_texts():
    """id -> text over every source (for joining labels back)."""
    return {id_: text for s in SOURCES for id_, text, _ in texts(s)}


def write_batches(source, size, limit=None):
    # A text another source already holds is labelled there (prepare.py keeps
    # one copy), so it is not labelled twice.
    others = {dedup_key(t) for s in SOURCES if s != source for _, t, _ in texts(s)}
    rows = [r for r in texts(source) if dedup_key(r[1]) not in others]
    random.Random(SEED).shuffle(rows)
    if limit:
        rows = rows[:limit]
    out = WORK / "labelling" / "batches"
    out.mkdir(parents=True, exist_ok=True)
    for n in range(0, len(rows), size):
        name = out / f"{source}_{n // size:03d}.jsonl"
        with open(name, "w", encoding="utf-8") as f:
            for id_, text, context in rows[n : n + size]:
                d = {"id": id_, "text": text}
                if context:
                    d["context"] = [f"{who}: {t}" for who, t in context]
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"{source}: {len(rows)} texts in {(len(rows) + size - 1) // size} batches of {size}")


if __name__ == "__main__":
    if sys.argv[1] == "batches":
        write_batches(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)
