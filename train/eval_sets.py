"""Loaders for the measurement-only sets (eval/ and restricted/), each mapped to
our categories. Never used to fit anything: training only reads them to drop
duplicates of their texts.

Every loader returns (texts, labels) where labels maps a category (or "any")
to a list of 1/0/None; None means the set says nothing about that category
for that text, and it is left out of that category's metrics."""

import ast
import csv
import json

from common import CATEGORIES, DATASETS

csv.field_size_limit(10**8)
EVAL = DATASETS / "eval"
RESTRICTED = DATASETS / "restricted"


def _labels(n, cats):
    return {c: [None] * n for c in cats}


def hatecheck():
    rows = list(csv.DictReader(open(EVAL / "hatecheck_test_suite_cases.csv", encoding="utf-8", errors="replace")))
    texts = [r["test_case"].strip() for r in rows]
    hateful = [1 if r["label_gold"] == "hateful" else 0 for r in rows]
    threat = [1 if r["functionality"].startswith("threat_") and h else 0 for r, h in zip(rows, hateful)]
    return texts, {"hate": hateful, "hate/threatening": threat, "any": hateful}


# OpenAI's 2022 moderation taxonomy (the validation half's keys) in our names.
# There, violence means promoting or glorifying violence or celebrating
# suffering; depictions alone are V2 (graphic). A missing key is unknown.
OPENAI_MAP = {
    "S": "sexual",
    "H": "hate",
    "V": "violence",
    "HR": "harassment",
    "SH": "self-harm",
    "S3": "sexual/minors",
    "H2": "hate/threatening",
    "V2": "violence/graphic",
}
VALIDATION = EVAL / "openai_moderation" / "validation_half.jsonl"


def validation():
    """The validation half of OpenAI's moderation evaluation set: models,
    sources and thresholds are chosen on it; nothing is trained on it."""
    rows = [json.loads(line) for line in open(VALIDATION, encoding="utf-8")]
    texts = [r["prompt"] for r in rows]
    labels = {c: [r.get(k) for r in rows] for k, c in OPENAI_MAP.items()}
    labels["any"] = [
        None if all(r.get(k) is None for k in OPENAI_MAP) else int(any(r.get(k) == 1 for k in OPENAI_MAP))
        for r in rows
    ]
    return texts, labels


AILUMINATE_MAP = {"hte": "hate", "ssh": "self-harm", "sxc_prn": "sexual", "cse": "sexual/minors", "vcr": "violence"}


def ailuminate():
    rows = list(csv.DictReader(open(EVAL / "ailuminate_demo_en_us.csv", encoding="utf-8", errors="replace")))
    texts = [r["prompt_text"] for r in rows]
    labels = {}
    for hz, cat in AILUMINATE_MAP.items():
        # Weapons (iwp) prompts are not negatives for violence: they often are violent.
        labels[cat] = [1 if r["hazard"] == hz else (None if cat == "violence" and r["hazard"] == "iwp" else 0) for r in rows]
    labels["any"] = [1 if r["hazard"] in AILUMINATE_MAP else 0 for r in rows]
    return texts, labels


def simplesafetytests():
    rows = list(csv.DictReader(open(EVAL / "simplesafetytests.csv", encoding="utf-8", errors="replace")))
    texts = [r["prompts_final"] for r in rows]
    area = [r["harm_area"] for r in rows]
    sh = [1 if a.startswith("Suicide") else 0 for a in area]
    vi = [1 if a.startswith("Physical harm") else 0 for a in area]
    return texts, {"self-harm": sh, "violence": vi, "any": [max(a, b) for a, b in zip(sh, vi)]}


def ethos():
    rows = list(csv.DictReader(open(RESTRICTED / "ethos_binary.csv", encoding="utf-8", errors="replace"), delimiter=";"))
    texts = [r["comment"] for r in rows]
    hate = [1 if float(r["isHate"]) >= 0.5 else 0 for r in rows]
    return texts, {"hate": hate, "any": hate}


def ethos_violence():
    rows = list(csv.DictReader(open(RESTRICTED / "ethos_multilabel.csv", encoding="utf-8", errors="replace"), delimiter=";"))
    texts = [r["comment"] for r in rows]
    vio = [1 if float(r["violence"]) >= 0.5 else 0 for r in rows]
    # Every multilabel row is hateful; violent ones are threats against a group.
    return texts, {"violence": vio, "hate/threatening": vio}


def toxicchat():
    texts, tox = [], []
    for split in ("train", "test"):
        d = json.load(open(RESTRICTED / f"toxicchat_judgebench_{split}.json", encoding="utf-8", errors="replace"))
        for inst in d["instances"]:
            texts.append(inst["instance"])
            tox.append(1 if inst["annotations"]["toxicity"]["majority_human"] == "1" else 0)
    return texts, {"any": tox}


def olid():
    rows = list(csv.DictReader(open(RESTRICTED / "olid_training_v1.0.tsv", encoding="utf-8", errors="replace"), delimiter="\t"))
    texts = [r["tweet"] for r in rows]
    off = [1 if r["subtask_a"] == "OFF" else 0 for r in rows]
    ind = [1 if r["subtask_c"] == "IND" else 0 for r in rows]
    grp = [1 if r["subtask_c"] == "GRP" else 0 for r in rows]
    return texts, {"harassment": ind, "hate": grp, "any": off}


def twitter_suicidal():
    rows = list(csv.DictReader(open(RESTRICTED / "twitter_suicidal_intention.csv", encoding="utf-8", errors="replace")))
    texts = [r["tweet"] for r in rows]
    y = [int(r["intention"]) for r in rows]
    return texts, {"self-harm": y, "any": y}


def suicide_detection():
    rows = list(csv.DictReader(open(RESTRICTED / "Suicide_Detection_sample500.csv", encoding="utf-8", errors="replace")))
    texts = [r["text"] for r in rows]
    y = [1 if r["class"] == "suicide" else 0 for r in rows]
    return texts, {"self-harm": y, "any": y}


def cssrs():
    rows = list(csv.DictReader(open(RESTRICTED / "cssrs_500_Reddit_users_posts_labels.csv", encoding="utf-8", errors="replace")))
    texts = []
    for r in rows:
        try:
            posts = ast.literal_eval(r["Post"])
            texts.append("\n".join(posts) if isinstance(posts, list) else str(posts))
        except (ValueError, SyntaxError):
            texts.append(r["Post"])
    y = [1 if r["Label"] in ("Ideation", "Behavior", "Attempt") else 0 for r in rows]
    return texts, {"self-harm": y, "any": y}


def threats():
    rows = list(csv.DictReader(open(RESTRICTED / "threat_augmented_20250205_134950.csv", encoding="utf-8", errors="replace")))
    texts = [r["text"] for r in rows]
    y = [1] * len(rows)
    # Positives only: recall at the shipped threshold is the meaningful figure.
    return texts, {"violence": y, "harassment/threatening": y, "any": y}


def _dev_rows():
    from common import ROOT
    from corpus import explicit_labels

    rows = []
    for path in sorted((ROOT / "train" / "dev").glob("*.jsonl")):
        rows += [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    for r in rows:
        r["labels"] = explicit_labels(r)
    return rows


def dev_hard_negatives():
    """The development set's harmless texts that share the vocabulary of harm
    (kind hard_negative): their any-category FPR is our estimate of the
    false alarms on safe prompts with alarming words."""
    rows = [r for r in _dev_rows() if r.get("kind") == "hard_negative"]
    return [r["text"] for r in rows], {"any": [0] * len(rows)}


def dev():
    """The development set written for this project in a separate pass from
    the training corpus (train/dev/, see the data card): never trained on,
    never used to pick thresholds; training drops its near-duplicates."""
    from common import HEADS

    rows = _dev_rows()
    texts = [r["text"] for r in rows]
    cats = [h for h in HEADS if h != "minor"]
    labels = {c: [r["labels"].get(c) for r in rows] for c in cats}
    labels["any"] = [
        None if all(r["labels"].get(c) is None for c in cats) else int(any(r["labels"].get(c) == 1 for c in cats))
        for r in rows
    ]
    return texts, labels


SETS = {
    "validation": ("eval", validation),
    "dev": ("written dev set", dev),
    "dev_hard_negatives": ("written dev set, hard negatives only", dev_hard_negatives),
    "hatecheck": ("eval", hatecheck),
    "ailuminate": ("eval", ailuminate),
    "simplesafetytests": ("eval", simplesafetytests),
    "ethos": ("restricted", ethos),
    "ethos_violence": ("restricted", ethos_violence),
    "toxicchat": ("restricted", toxicchat),
    "olid": ("restricted", olid),
    "twitter_suicidal": ("restricted", twitter_suicidal),
    "suicide_detection": ("restricted", suicide_detection),
    "cssrs": ("restricted", cssrs),
    "threat_augmented": ("restricted", threats),
}


def load_all():
    out = {}
    for name, (kind, fn) in SETS.items():
        texts, labels = fn()
        for c in labels:
            assert c == "any" or c in CATEGORIES, c
            assert len(labels[c]) == len(texts)
        out[name] = (kind, texts, labels)
    return out
