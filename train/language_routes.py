"""How the language detector (src/moderation/text/language.rs) routes and
names texts of known language: Multilingual HateCheck's validation half
(10 languages), English HateCheck (3,728 short sentences) and the English
validation half. Prints one line per set: the share of each route, the share
of texts it names a language for, and how many of those are right.

Usage: python language_routes.py   (needs `cargo build --example language`)"""

import collections
import csv
import json
import subprocess
import tempfile
from pathlib import Path

from common import DATASETS, examples_dir


def sets():
    out = []
    for line in open(DATASETS / "eval" / "multilingual_hatecheck" / "validation.jsonl", encoding="utf-8"):
        d = json.loads(line)
        out.append((d["lang"], d["text"]))
    for r in csv.DictReader(open(DATASETS / "eval" / "hatecheck_test_suite_cases.csv", encoding="utf-8")):
        out.append(("en (HateCheck)", r["test_case"]))
    for line in open(DATASETS / "eval" / "openai_moderation" / "validation_half.jsonl", encoding="utf-8"):
        out.append(("en (validation half)", json.loads(line)["prompt"]))
    return out


def main():
    rows = sets()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "in.jsonl"
        path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for _, t in rows))
        out = subprocess.run([str(examples_dir() / "language"), str(path)], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    res = [json.loads(line) for line in out]
    print("| set | texts | English route | other-language route | unsure | language named | named right |")
    print("|---|---|---|---|---|---|---|")
    for group in sorted({g for g, _ in rows}):
        idx = [k for k, (g, _) in enumerate(rows) if g == group]
        routes = collections.Counter(res[k]["route"] for k in idx)
        want = group.split(" ")[0]
        named = [res[k]["served"] for k in idx if res[k]["served"]]
        share = lambda n: f"{n / len(idx):.1%}"  # noqa: E731
        print(f"| {group} | {len(idx)} | {share(routes['English'])} | {share(routes['Other'])} | "
              f"{share(routes['Unsure'])} | {share(len(named))} | {sum(n == want for n in named) / max(len(named), 1):.1%} |")


if __name__ == "__main__":
    main()
