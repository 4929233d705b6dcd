#!/usr/bin/env python3
"""Replays a set of texts through a running service, N texts a request, and
prints the wall time and characters per second: how long scoring a whole
evaluation set takes through the API (not a test; no third-party packages).

    benches/replay.py --key KEY --per-request 8 --concurrency 2 FILE[:COLUMN] ...

A FILE is JSON lines (the "text" field) or CSV (COLUMN names the text
column). --limit N,N,... takes the first texts of the files in order, so that the
same command measures the same texts every time.
"""

import argparse
import csv
import json
import sys
import threading
import time
import urllib.error
import urllib.request


def read_texts(spec):
    path, _, column = spec.partition(":")
    with open(path, encoding="utf-8", newline="") as f:
        if path.endswith(".jsonl"):
            return [json.loads(line)["text"] for line in f if line.strip()]
        return [row[column] for row in csv.DictReader(f) if row.get(column, "").strip()]


def post(url, key, texts):
    body = json.dumps({"input": [{"type": "text", "text": t} for t in texts]}).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", "X-API-Key": key}
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as e:
        status = e.code
    return status, time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--url", default="http://127.0.0.1:8080/v1/moderate")
    parser.add_argument("--key", required=True)
    parser.add_argument("--per-request", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--limit", default="", help="texts to take from each file, in order: comma-separated counts")
    args = parser.parse_args()

    limits = [int(n) for n in args.limit.split(",") if n]
    texts = []
    for i, spec in enumerate(args.files):
        got = read_texts(spec)
        if i < len(limits):
            got = got[: limits[i]]
        texts.extend(got)
    batches = [texts[i : i + args.per_request] for i in range(0, len(texts), args.per_request)]
    lock = threading.Lock()
    statuses, latencies = {}, []
    pending = iter(batches)

    def worker():
        while True:
            with lock:
                batch = next(pending, None)
            if batch is None:
                return
            status, seconds = post(args.url, args.key, batch)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                latencies.append(seconds)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    chars = sum(len(t) for t in texts)
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    print(
        f"{len(texts)} texts ({chars} characters) in {len(batches)} requests of {args.per_request}, "
        f"{args.concurrency} at a time: {wall:.1f} s, {chars / wall:.0f} characters/s, "
        f"request p50 {p50:.0f} ms, p99 {p99:.0f} ms, statuses {statuses}"
    )
    return 0 if set(statuses) == {200} else 1


if __name__ == "__main__":
    sys.exit(main())
