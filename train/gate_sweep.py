"""How much of the second stage's gain each gate keeps, and what share of
texts pays for it. The second stage (e5) reads a text again only when its
strongest first-stage score reaches the heads' gate; the gate therefore sets
the second stage's CPU cost on real traffic. For each gate this prints, per
set, the share of texts read again and the figures of compare.py (at the
heads' own thresholds), from one first-stage and one e5 scoring of the set,
and the any-category difference from the heads' own gate with its 95 %
paired bootstrap interval.

Gates are either absolute (`0.3`: strongest score >= 0.3) or relative to the
thresholds (`t0.5`: some category's score >= half its threshold).

Usage: python gate_sweep.py HEADS.json [sets] [gates]
Sets default to the validation half, ToxicChat and the development set;
`bench` adds benches/texts/mixed.jsonl (unlabelled: the share read only)."""

import json
import sys
from pathlib import Path

import numpy as np

from common import (
    CATEGORIES,
    apply_heads,
    decide,
    e5_if_needed,
    e5_logits,
    embed_texts,
    lexical_features,
    paired_auprc_interval,
    second_stage,
)
from compare import figures, sampled_set
import eval_sets

ROOT = Path(__file__).resolve().parent.parent


def first_stage_and_e5(heads, texts, name):
    cfg = dict(heads, input="raw")
    vecs, idx = embed_texts(texts, cfg, name, namespace="wide")
    first = apply_heads(dict(cfg, e5=None), vecs, idx, len(texts), lexical_features(texts))
    return first, e5_logits(heads["e5"], e5_if_needed(cfg, texts, name))


def read_again(first, thresholds, gate):
    if gate.startswith("t"):
        return (first >= float(gate[1:]) * thresholds).any(axis=1)
    return first.max(axis=1) >= float(gate)


def gated_scores(heads, first, Z, consulted):
    """second_stage on the consulted texts only (its own gate set to 0)."""
    S = np.array(first, dtype=np.float32)
    if consulted.any():
        block = dict(heads["e5"], gate=0.0)
        S[consulted] = second_stage(first[consulted], Z[consulted], block, heads.get("parents", []))
    return S


def main():
    heads = json.loads(Path(sys.argv[1]).read_text())
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["validation", "toxicchat", "dev"]
    gates = sys.argv[3].split(",") if len(sys.argv) > 3 else ["0", "0.1", "0.2", "0.3", "0.5", "t0.25", "t0.5", "t1", "1.01"]
    thresholds = np.array([heads["thresholds"][c] for c in CATEGORIES])
    sets = eval_sets.load_all()
    print("| set (texts) | gate | read again | any | vs own gate (95 % interval) | per-category | F1 | FPR | recall |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        if name == "bench":
            texts = [json.loads(line)["text"] for line in open(ROOT / "benches/texts/mixed.jsonl", encoding="utf-8")]
            texts.append("Thanks for the quick reply, see you at the meeting tomorrow!")
            labels = None
        else:
            texts, labels = sampled_set(sets, name)
        first, Z = first_stage_and_e5(heads, texts, name)
        own = gated_scores(heads, first, Z, first.max(axis=1) >= heads["e5"]["gate"])
        ya = np.array([np.nan if v is None else v for v in labels["any"]], dtype=float) if labels and "any" in labels else None
        for gate in gates:
            consulted = read_again(first, thresholds, gate)
            S = gated_scores(heads, first, Z, consulted)
            share = f"{consulted.mean():.1%}"
            if labels is None:
                print(f"| {name} ({len(texts)}) | {gate} | {share} | | | | | | |")
                continue
            flags = decide(S, thresholds, heads.get("parents", []))
            f = figures(S, flags, labels, np.arange(len(texts)))
            versus = ""
            if ya is not None:
                k = ~np.isnan(ya)
                y = ya[k].astype(int)
                lo, hi = paired_auprc_interval(y, own[k].max(axis=1), S[k].max(axis=1), seed=20261128)
                f_own = figures(own, decide(own, thresholds, heads.get("parents", [])), labels, np.arange(len(texts)))
                versus = f"{f['any'] - f_own['any']:+.3f} ({lo:+.3f}..{hi:+.3f})"
            print(
                f"| {name} ({len(texts)}) | {gate} | {share} | {f['any']:.3f} | {versus} | {f['per_cat']:.3f} "
                f"| {f['f1']:.3f} | {f['fpr']:.3f} | {f['recall']:.3f} |"
            )
        if name == "bench":
            print(f"short text's strongest first-stage score: {first[-1].max():.3f} ({CATEGORIES[int(first[-1].argmax())]})")


if __name__ == "__main__":
    main()
