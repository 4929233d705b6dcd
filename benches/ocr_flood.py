#!/usr/bin/env python3
"""Issue #58, B, rerun: a free key floods the OCR with images of thin bars
(40 "lines" each) while another account sends small images; and D: what
`"explain": true` costs on 4 items of 25,000 characters of "kys ".

Runs the binary (default: target/release/moderato) on loopback with its own
SQLite file, sends bounded traffic only to 127.0.0.1, and prints:
  - the attacker's requests: status, seconds, characters charged, server CPU;
  - the victim's small-image latencies alone and during the flood (p50/p90/max);
  - explain's cost: server CPU-seconds with and without explain.
Not a test: figures for docs/security-work.md.

  benches/ocr_flood.py [--bin target/release/moderato] [--attackers 2] [--seconds 30]
"""
import argparse
import base64
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from PIL import Image, ImageDraw

PORT = 18093
BASE = f"http://127.0.0.1:{PORT}"


def png(image):
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def bars_png(seed=0):
    """1024x1024, 40 rows of thin bars: the detector finds 40 lines. `seed`
    shifts the bars (images that differ byte for byte)."""
    image = Image.new("RGB", (1024, 1024), "white")
    draw = ImageDraw.Draw(image)
    for row in range(40):
        y = 12 + row * 25 + seed % 3
        for x in range(8 + seed % 5, 1010, 12):
            draw.rectangle([x, y, x + 5, y + 9], fill="black")
    return png(image)


def small_png():
    image = Image.new("RGB", (64, 64), (120, 160, 200))
    ImageDraw.Draw(image).ellipse([16, 16, 48, 48], fill=(240, 200, 80))
    return png(image)


def item(data):
    return {"type": "image", "base64": "data:image/png;base64," + base64.b64encode(data).decode()}


def post(key, body, timeout=120):
    request = urllib.request.Request(
        BASE + "/v1/moderate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-API-Key": key},
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            status, headers = response.status, response.headers
    except urllib.error.HTTPError as e:
        e.read()
        status, headers = e.code, e.headers
    return status, time.monotonic() - started, headers


def server_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def create_key(binary, env, tier, name):
    command = [binary, "keys", "create", "--name", name, "--tier", tier, "--json"]
    if tier == "enterprise":
        command += ["--rpm", "100000"]
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"keys create failed: {out.stderr}")
    return json.loads(out.stdout)["key"]


def quantiles(xs):
    xs = sorted(xs)
    if not xs:
        return "none"
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]
    return f"n={len(xs)} p50={pick(0.5):.3f}s p90={pick(0.9):.3f}s max={xs[-1]:.3f}s"


def flood(server, attacker, victim, quiet, body, what, args):
    """`args.attackers` loops of the attacker's requests for `args.seconds`,
    and the victim's small image every 0.1 s meanwhile."""
    stop = time.monotonic() + args.seconds
    results = []
    sent = [0]

    def attack():
        while time.monotonic() < stop:
            n = sent[0]
            sent[0] += 1
            status, seconds, headers = post(attacker, body(n))
            results.append((status, seconds, headers.get("x-ratelimit-remaining-characters")))
            if status == 429:
                time.sleep(1)

    cpu_before = server_cpu(server.pid)
    threads = [threading.Thread(target=attack) for _ in range(args.attackers)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    during = []
    while time.monotonic() < stop:
        during.append(post(victim, quiet)[1])
        time.sleep(0.1)
    for t in threads:
        t.join()
    cpu = server_cpu(server.pid) - cpu_before
    print(f"== {what} bar images, {args.attackers} attacker loops (one free key), {args.seconds:.0f} s")
    print("  victim small image meanwhile:", quantiles(during))
    print(f"  server CPU: {cpu:.1f} CPU-s (victim's requests included)")
    statuses = {}
    for status, seconds, remaining in results:
        statuses.setdefault(status, []).append(seconds)
    for status, times in sorted(statuses.items()):
        print(f"  attacker {status}: {len(times)} requests, {quantiles(times)}")
    print("  attacker's characters remaining after each 200:",
          [r for s, _, r in results if s == 200][:12])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="target/release/moderato")
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    binary = os.path.abspath(args.bin)
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    work = tempfile.mkdtemp()
    env = dict(os.environ)
    env.update({
        "MODERATO_DATABASE_URL": f"sqlite://{work}/bench.db",
        "MODERATO_AUTH__PEPPER_FILE": f"{work}/pepper",
        "MODERATO_SIGNING__KEY_FILE": f"{work}/signing-key.pem",
        "MODERATO_USAGE__JOURNAL_DIR": f"{work}/usage-journal",
        "MODERATO_LOG": "error",
        "MODERATO_ADDR": f"127.0.0.1:{PORT}",
    })
    attacker = create_key(binary, env, "free", "attacker")
    victim = create_key(binary, env, "pro", "victim")
    explainer = create_key(binary, env, "enterprise", "explain")
    calibration = [create_key(binary, env, "pro", f"calibrate{i}") for i in range(4)]
    server = subprocess.Popen([binary, "serve"], env=env)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(BASE + "/ready", timeout=1).read()
                break
            except Exception:
                time.sleep(0.2)
        small = small_png()
        quiet = {"input": [item(small)]}
        # What a character of the allowance buys: one image of bars at a
        # time; its charge is its usage record's characters (OCR work and
        # text read), as the bucket refills while it is paid.
        post(explainer, {"input": [item(bars_png(999))]})
        for n, key in enumerate(calibration):
            before = server_cpu(server.pid)
            status, seconds, headers = post(key, {"input": [item(bars_png(1000 + n))]})
            cpu = server_cpu(server.pid) - before
            request_id = headers.get("x-request-id")
            charge = None
            for _ in range(50):
                time.sleep(0.2)
                with sqlite3.connect(f"{work}/bench.db") as db:
                    row = db.execute("SELECT text_chars FROM usage_events WHERE request_id = ?",
                                     (request_id,)).fetchone()
                if row:
                    charge = row[0]
                    break
            print(f"one bar image: {status} in {seconds:.2f} s, {cpu:.2f} CPU-s, charged {charge} characters"
                  f" ({(charge or 0) / max(cpu, 1e-9):,.0f} characters per CPU-s)")
        alone = [post(victim, quiet)[1] for _ in range(20)]
        print("victim small image alone:", quantiles(alone))
        # The attack (8 identical images), then the worst case for
        # the cache (8 different images in every request).
        same = {"input": [item(bars_png(0))] * 8}
        different = [{"input": [item(bars_png(r * 8 + i)) for i in range(8)]} for r in range(64)]
        flood(server, attacker, victim, quiet, lambda n: same, "8 identical", args)
        flood(server, attacker, victim, quiet, lambda n: different[n % 64], "8 different", args)

        kys = {"input": [{"type": "text", "text": "kys " * 6250} for _ in range(4)]}
        for explain in (False, True):
            body = dict(kys, explain=explain)
            post(explainer, body)
            before = server_cpu(server.pid)
            seconds = [post(explainer, body)[1] for _ in range(3)]
            cpu = (server_cpu(server.pid) - before) / 3
            print(f"4 x 25,000 chars of 'kys ', explain={explain}: {cpu:.2f} CPU-s, {min(seconds):.2f} s each")
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
