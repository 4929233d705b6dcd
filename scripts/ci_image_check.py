#!/usr/bin/env python3
"""Runs the container image as an operator would and checks it, end to end.

Called by scripts/ci-image.sh once the image is built. Python's standard
library only; the machine's PostgreSQL (a database of its own per part) and
Redis (a database number of its own), podman on the host network.

One container:
  - runs as the non-root user, with a read-only root file system (nothing
    writable but the data volume: not even /tmp), its models inside (a text
    and an image item are scored), configured by MODERATO_* variables only;
  - the image's HEALTHCHECK (`moderato health`) passes once it is ready;
  - SIGTERM with requests in flight: every one of them is answered 200, the
    process exits 0, and each answered request's usage row is in the
    database (the flush interval is set to a minute, so only the shutdown's
    flush can have written them).

Two replicas behind HAProxy (deploy/haproxy.cfg, the replicas' addresses
put on loopback):
  - a key made in replica A's dashboard works through replica B within a
    second;
  - an account's plan limit is exact across replicas: a free account (10 a
    minute) sends 30 requests spread over both, exactly 10 succeed;
  - every request is metered once: usage rows = requests answered (billable
    rows = 200s);
  - SIGKILL of one replica under load: HAProxy marks it down and sends the
    rest to the other, and once the killed replica restarts (replaying its
    journal) every 2xx the client saw has its usage row;
  - a rolling restart under steady load (drain one in HAProxy, SIGTERM it,
    start it, wait until healthy and back in the pool, then the other)
    fails no request.
"""

import argparse
import base64
import concurrent.futures
import http.client
import json
import os
import pathlib
import random
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PODMAN = [
    "podman",
    "--cgroup-manager=cgroupfs",
    "--storage-driver=vfs",
    "--runtime=runc",
]
# What this sandbox lets a container have (raising a limit is refused).
ULIMITS = ["--ulimit", "nofile=16384:16384", "--ulimit", "nproc=4096:4096"]
PG_ADMIN = os.environ.get("MODERATO_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
PG_HOST = "127.0.0.1"
REDIS_URL = "redis://127.0.0.1:6379/7"
PASSWORD = "correct horse battery staple"
TEXT = "Thanks for the quick reply, see you at the meeting tomorrow."
PORTS = {"single": 18180, "lb": 18190, "r1": 18191, "r2": 18192}


def log(message):
    print(f"ci-image: {message}", flush=True)


class CheckFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


# --- processes -------------------------------------------------------------


def run(args, *, stdin=None, check_rc=True):
    result = subprocess.run(args, input=stdin, capture_output=True, text=True)
    if check_rc and result.returncode != 0:
        raise CheckFailed(f"{' '.join(args[:6])}... failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result


def podman(*args, **kwargs):
    return run(PODMAN + list(args), **kwargs)


def psql(database, sql):
    # On standard input: a list of request ids is longer than a command line.
    out = run(["psql", "-h", PG_HOST, "-U", "postgres", "-d", database, "-tAq", "-v", "ON_ERROR_STOP=1", "-f", "-"], stdin=sql).stdout
    return out.strip()


def recreate_database(name):
    psql("postgres", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    psql("postgres", f"CREATE DATABASE {name}")


def signing_key_pem():
    """A fresh Ed25519 key, PKCS#8 PEM: every replica signs with the same."""
    return run(["openssl", "genpkey", "-algorithm", "ed25519"]).stdout


class Replica:
    """One container of the image on the host network."""

    def __init__(self, image, name, port, database, env):
        self.image, self.name, self.port, self.database = image, name, port, database
        self.volume = f"{name}-data"
        self.env = {
            "MODERATO_ADDR": f"127.0.0.1:{port}",
            "MODERATO_METRICS_ADDR": "",
            "MODERATO_DATABASE_URL": f"postgres://postgres@{PG_HOST}:5432/{database}",
            "MODERATO_LOG": "warn,moderato=info",
            **env,
        }

    def env_args(self):
        args = []
        for key, value in self.env.items():
            args += ["-e", f"{key}={value}"]
        return args

    def start(self):
        podman("rm", "--force", "--volumes", self.name, check_rc=False)
        podman("volume", "rm", "--force", self.volume, check_rc=False)
        podman(
            "run", "--detach", "--name", self.name, "--network", "host",
            "--read-only", "--read-only-tmpfs=false", *ULIMITS,
            "--volume", f"{self.volume}:/var/lib/moderato/data",
            *self.env_args(), self.image,
        )

    def restart(self):
        """Starts the same container again: same volume, so same journal."""
        podman("start", self.name)

    def cli(self, *args, stdin=None):
        """`moderato ARGS` in a throw-away container with the same settings."""
        result = podman(
            "run", "--rm", "--interactive", "--network", "host", "--read-only",
            *ULIMITS, *self.env_args(), self.image, *args, stdin=stdin,
        )
        return json.loads(result.stdout)

    def healthy(self):
        return podman("healthcheck", "run", self.name, check_rc=False).returncode == 0

    def wait_healthy(self, seconds=180):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.healthy():
                return
            state = podman("inspect", "--format", "{{.State.Status}}", self.name).stdout.strip()
            check(state == "running", f"{self.name} is {state}:\n{self.logs()}")
            time.sleep(0.5)
        raise CheckFailed(f"{self.name} not healthy after {seconds} s:\n{self.logs()}")

    def signal(self, name):
        podman("kill", "--signal", name, self.name)

    def wait_exit(self, seconds=60):
        result = podman("wait", self.name)
        return int(result.stdout.strip().splitlines()[-1])

    def logs(self):
        result = podman("logs", "--tail", "40", self.name, check_rc=False)
        return result.stdout + result.stderr

    def remove(self):
        podman("rm", "--force", self.name, check_rc=False)
        podman("volume", "rm", "--force", self.volume, check_rc=False)


# --- HTTP ------------------------------------------------------------------


class Answer:
    def __init__(self, status, headers, body, done_at):
        self.status, self.headers, self.body, self.done_at = status, headers, body, done_at

    @property
    def request_id(self):
        return self.headers.get("x-request-id")

    def json(self):
        return json.loads(self.body)


def request(port, method, path, body=None, headers=None, timeout=60):
    """One request on a connection of its own; status -1 when it failed."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        raw_headers = {}
        for key, value in response.getheaders():
            raw_headers.setdefault(key.lower(), []).append(value)
        body = response.read().decode("utf-8", "replace")
        headers = {k: v[0] for k, v in raw_headers.items()}
        headers["set-cookie-all"] = raw_headers.get("set-cookie", [])
        return Answer(response.status, headers, body, time.monotonic())
    except (OSError, http.client.HTTPException) as error:
        return Answer(-1, {}, str(error), time.monotonic())
    finally:
        connection.close()


def moderate(port, key, items=None):
    items = items or [{"type": "text", "text": TEXT}]
    body = json.dumps({"input": items})
    return request(port, "POST", "/v1/moderate", body, {"X-API-Key": key, "Content-Type": "application/json"})


class Dashboard:
    """A browser-less dashboard session against one replica."""

    def __init__(self, port):
        self.port, self.cookies = port, {}

    def send(self, method, path, form=None):
        headers = {}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = "&".join(f"{k}={urllib_quote(v)}" for k, v in form.items())
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        answer = request(self.port, method, path, body, headers)
        for raw in answer.headers.get("set-cookie-all", []):
            name, _, rest = raw.partition("=")
            value = rest.split(";", 1)[0]
            if value and "max-age=0" not in raw.lower():
                self.cookies[name.strip()] = value
            else:
                self.cookies.pop(name.strip(), None)
        return answer

    @staticmethod
    def csrf(page):
        found = re.search(r'name="csrf_token"\s+value="([^"]+)"', page.body) or re.search(
            r'value="([^"]+)"\s+name="csrf_token"', page.body
        )
        check(found, f"no csrf_token in the page ({page.status})")
        return found.group(1)

    def sign_in(self, email):
        login = self.send("GET", "/dashboard/login")
        check(login.status == 200, f"login page: {login.status}")
        answer = self.send("POST", "/dashboard/login", {"email": email, "password": PASSWORD, "csrf_token": self.csrf(login)})
        check(answer.status == 303, f"sign-in answered {answer.status}: {answer.body[:500]}")

    def create_key(self, name):
        page = self.send("GET", "/dashboard/keys")
        check(page.status == 200, f"keys page: {page.status}")
        answer = self.send("POST", "/dashboard/keys", {"name": name, "csrf_token": self.csrf(page)})
        found = re.search(r'data-testid="new-key">([^<]+)<', answer.body)
        check(answer.status == 200 and found, f"dashboard key creation answered {answer.status}")
        return found.group(1).strip()


def urllib_quote(value):
    from urllib.parse import quote

    return quote(value, safe="")


def usage_rows(database, request_ids):
    """Which of `request_ids` have a usage row."""
    if not request_ids:
        return set()
    listed = ",".join(f"'{i}'" for i in request_ids)
    out = psql(database, f"SELECT request_id FROM usage_events WHERE request_id IN ({listed})")
    return set(out.split())


def wait_for_rows(database, request_ids, seconds=15):
    deadline = time.monotonic() + seconds
    while True:
        found = usage_rows(database, request_ids)
        if found >= set(request_ids) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


# --- one container ---------------------------------------------------------


def check_single(image, pepper, signing_key):
    database = "moderato_image"
    recreate_database(database)
    replica = Replica(
        image, "moderato-ci-single", PORTS["single"], database,
        {
            "MODERATO_AUTH__PEPPER": pepper,
            "MODERATO_SIGNING__PRIVATE_KEY": signing_key,
            # Batches wait a minute: only the shutdown's flush (or a restart's
            # replay, which this check does not do) can store the events.
            "MODERATO_USAGE__FLUSH_INTERVAL_MS": "60000",
        },
    )
    replica.start()
    try:
        started = time.monotonic()
        replica.wait_healthy()
        log(f"single: healthy (HEALTHCHECK passed) {time.monotonic() - started:.1f} s after start")

        uid = podman("exec", replica.name, "id", "-u").stdout.strip()
        check(uid == "10001", f"the service runs as uid {uid}, not the image's moderato user")
        for path in ["/opt/moderato/models", "/tmp", "/var/lib/moderato"]:
            probe = podman("exec", replica.name, "touch", f"{path}/write-probe", check_rc=False)
            check(probe.returncode != 0, f"{path} is writable: the root file system is not read-only")
        journal = podman("exec", replica.name, "ls", "/var/lib/moderato/data/usage-journal", check_rc=False)
        check(journal.returncode == 0, f"no usage journal on the data volume: {journal.stderr}")
        log("single: uid 10001, root file system read-only, journal on the volume")

        key = replica.cli("keys", "create", "--name", "ci", "--tier", "enterprise", "--rpm", "100000", "--json")["key"]
        png = (ROOT / "tests/fixtures/images/shapes.png").read_bytes()
        items = [
            {"type": "text", "text": TEXT},
            {"type": "image", "base64": "data:image/png;base64," + base64.b64encode(png).decode()},
        ]
        answer = moderate(replica.port, key, items)
        check(answer.status == 200, f"moderate answered {answer.status}: {answer.body[:500]}")
        results = answer.json()["results"]
        check([r["type"] for r in results] == ["text", "image"], f"results: {results}")
        check(all(r["category_scores"] for r in results), "an item has no scores: a model is missing")
        log(f"single: text and image scored by the image's models ({answer.json()['model']})")

        check_sigterm_drains(replica, key, database)
    finally:
        replica.remove()


def check_sigterm_drains(replica, key, database):
    """SIGTERM while requests are in flight: all answered, all metered."""
    # Long texts, a different one each (the embedding cache would make
    # repeats cheap), keep both cores busy for a few seconds, so that most
    # requests are still being scored when SIGTERM arrives.
    words = ("committee review proposal publish findings council budget river bridge "
             "harbour library garden museum school market station weather season").split()
    count = 12
    rngs = [random.Random(i) for i in range(count)]
    texts = [" ".join(rng.choice(words) for _ in range(300)) for rng in rngs]
    barrier = threading.Barrier(count + 1)

    def one(index):
        barrier.wait()
        return moderate(replica.port, key, [{"type": "text", "text": texts[index]}])

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(one, i) for i in range(count)]
        barrier.wait()
        time.sleep(0.5)
        signalled_at = time.monotonic()
        replica.signal("TERM")
        answers = [f.result() for f in futures]
    code = replica.wait_exit()
    statuses = sorted(a.status for a in answers)
    after = sum(1 for a in answers if a.done_at > signalled_at)
    check(statuses == [200] * count, f"requests in flight at SIGTERM were not all answered 200: {statuses}\n{replica.logs()}")
    check(after > 0, "every request was answered before SIGTERM: nothing was in flight (make the requests heavier)")
    check(code == 0, f"the service exited {code} after SIGTERM:\n{replica.logs()}")
    ids = [a.request_id for a in answers]
    stored = usage_rows(database, ids)
    check(stored == set(ids), f"{len(set(ids) - stored)} answered requests have no usage row after SIGTERM")
    log(f"single: SIGTERM with {after} of {count} requests in flight: all answered 200, exit 0, {len(stored)} usage rows flushed")


# --- two replicas behind HAProxy -------------------------------------------


class Balancer:
    """HAProxy from deploy/haproxy.cfg, the replicas' addresses on loopback."""

    def __init__(self, workdir):
        self.socket_path = os.path.join(workdir, "haproxy.sock")
        config = (ROOT / "deploy/haproxy.cfg").read_text()
        config = config.replace("moderato-1:8080", f"127.0.0.1:{PORTS['r1']}")
        config = config.replace("moderato-2:8080", f"127.0.0.1:{PORTS['r2']}")
        config = config.replace("bind :8080", f"bind 127.0.0.1:{PORTS['lb']}")
        config = config.replace("/var/run/haproxy/admin.sock", self.socket_path)
        check("127.0.0.1:%d" % PORTS["r2"] in config, "deploy/haproxy.cfg no longer names moderato-1:8080 and moderato-2:8080")
        self.config_path = os.path.join(workdir, "haproxy.cfg")
        pathlib.Path(self.config_path).write_text(config)
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        run([haproxy, "-c", "-q", "-f", self.config_path])
        log_path = os.path.join(workdir, "haproxy.log")
        self.process = subprocess.Popen(
            [haproxy, "-db", "-f", self.config_path],
            stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while not os.path.exists(self.socket_path):
            check(self.process.poll() is None and time.monotonic() < deadline,
                  f"HAProxy did not start: {pathlib.Path(log_path).read_text()[-2000:]}")
            time.sleep(0.1)

    def command(self, line):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self.socket_path)
            s.sendall((line + "\n").encode())
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self):
        """Server name → (status, current sessions), from `show stat`."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        out = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row.get("pxname") == "moderato" and row.get("svname") not in ("FRONTEND", "BACKEND"):
                out[row["svname"]] = (row["status"], int(row["scur"] or 0))
        return out

    def wait_status(self, server, wanted, seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            status, _ = self.servers()[server]
            if status.startswith(wanted):
                return
            time.sleep(0.2)
        raise CheckFailed(f"HAProxy never saw {server} {wanted}: {self.servers()}")

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


class Load:
    """`threads` clients sending requests through the balancer until stopped."""

    def __init__(self, port, key, threads=6):
        self.port, self.key, self.answers = port, key, []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, daemon=True) for _ in range(threads)]

    def client(self):
        while not self.stopping.is_set():
            started = time.monotonic()
            answer = moderate(self.port, self.key)
            answer.started = started
            with self.lock:
                self.answers.append(answer)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for t in self.threads:
            t.join()


def check_replicas(image, pepper, signing_key, workdir):
    database = "moderato_replicas"
    recreate_database(database)
    env = {
        "MODERATO_AUTH__PEPPER": pepper,
        "MODERATO_SIGNING__PRIVATE_KEY": signing_key,
        "MODERATO_REDIS_URL": REDIS_URL,
        "MODERATO_AUTH__TRUSTED_PROXIES": '["127.0.0.1/32"]',
        # Plain HTTP on loopback: cookies without Secure.
        "MODERATO_DASHBOARD__COOKIE_SECURE": "false",
    }
    run(["redis-cli", "-u", REDIS_URL, "FLUSHDB"])
    r1 = Replica(image, "moderato-ci-r1", PORTS["r1"], database, env)
    r2 = Replica(image, "moderato-ci-r2", PORTS["r2"], database, env)
    # One at a time: both run the migrations at start, which is safe, but
    # starting them together only slows the two cores down.
    r1.start()
    r1.wait_healthy()
    r2.start()
    r2.wait_healthy()
    balancer = Balancer(workdir)
    try:
        balancer.wait_status("r1", "UP")
        balancer.wait_status("r2", "UP")
        log("replicas: two replicas healthy and UP in HAProxy")
        check_dashboard_key_crosses(r1, r2)
        check_plan_limit_is_shared(r1, r2, database)
        operator_key = r1.cli("keys", "create", "--name", "load", "--tier", "enterprise", "--rpm", "1000000", "--json")["key"]
        check_sigkill_loses_nothing(r1, balancer, operator_key, database)
        check_rolling_restart(r1, r2, balancer, operator_key, database)
    finally:
        balancer.stop()
        r1.remove()
        r2.remove()


def check_dashboard_key_crosses(r1, r2):
    r1.cli("accounts", "create", "--email", "crossing@example.com", "--role", "customer", "--tier", "basic", "--password-stdin", "--json", stdin=PASSWORD + "\n")
    session = Dashboard(r1.port)
    session.sign_in("crossing@example.com")
    key = session.create_key("made-on-r1")
    made_at = time.monotonic()
    while True:
        answer = moderate(r2.port, key)
        waited = time.monotonic() - made_at
        if answer.status == 200:
            break
        check(waited < 1.0, f"a key made in r1's dashboard was refused by r2 for {waited:.2f} s: {answer.status} {answer.body[:300]}")
        time.sleep(0.05)
    log(f"replicas: key made in r1's dashboard served by r2 after {waited * 1000:.0f} ms")


def check_plan_limit_is_shared(r1, r2, database):
    r1.cli("accounts", "create", "--email", "limited@example.com", "--role", "customer", "--tier", "free", "--password-stdin", "--json", stdin=PASSWORD + "\n")
    key = r1.cli("keys", "create", "--name", "limited", "--account", "limited@example.com", "--json")["key"]
    key_id = key.split("_")[1]
    ports = [r1.port, r2.port, PORTS["lb"]]
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda i: moderate(ports[i % 3], key), range(30)))
    statuses = [a.status for a in answers]
    check(statuses.count(200) == 10 and statuses.count(429) == 20, f"free plan over both replicas: {statuses.count(200)} × 200, {statuses.count(429)} × 429, others {sorted(set(statuses) - {200, 429})}")
    ids = [a.request_id for a in answers]
    check(len(set(ids)) == 30, "a request id was given twice")
    stored = wait_for_rows(database, ids)
    rows = psql(database, f"SELECT count(*), count(*) FILTER (WHERE billable) FROM usage_events WHERE key_id = '{key_id}'")
    total, billable = (int(x) for x in rows.split("|"))
    check(stored == set(ids) and total == 30 and billable == 10, f"usage rows: {total} (billable {billable}) for 30 requests, 10 × 200")
    log("replicas: free plan exact over both replicas (10 × 200, 20 × 429), 30 usage rows, 10 billable")


def check_sigkill_loses_nothing(r1, balancer, key, database):
    with Load(PORTS["lb"], key) as load:
        time.sleep(3)
        killed_at = time.monotonic()
        r1.signal("KILL")
        balancer.wait_status("r1", "DOWN", seconds=10)
        down_at = time.monotonic()
        time.sleep(3)
    answers = load.answers
    ok = [a for a in answers if a.status == 200]
    failed = [a for a in answers if a.status != 200]
    # Only requests already sent to r1 when it died may fail (not retried:
    # r1 may have metered them); every request started after HAProxy marked
    # it down was served by r2.
    late_failures = [a for a in failed if a.started > down_at]
    check(not late_failures, f"{len(late_failures)} requests failed after HAProxy marked r1 down: {[a.status for a in late_failures][:10]}")
    check(len(failed) <= len(load.threads), f"{len(failed)} requests failed around the kill, more than the {len(load.threads)} in flight")
    check(any(a.done_at > killed_at for a in ok), "no request succeeded after the kill")
    r1.restart()
    r1.wait_healthy()
    balancer.wait_status("r1", "UP")
    ids = [a.request_id for a in ok]
    stored = wait_for_rows(database, ids)
    check(stored == set(ids), f"{len(set(ids) - stored)} of {len(ids)} answered requests lost their usage row after SIGKILL and restart")
    log(f"replicas: SIGKILL of r1 under load: {len(ok)} × 200, {len(failed)} in flight failed, HAProxy marked it down in {down_at - killed_at:.2f} s, every 200 metered after r1 restarted")


def check_rolling_restart(r1, r2, balancer, key, database):
    with Load(PORTS["lb"], key) as load:
        time.sleep(2)
        for replica, server in ((r1, "r1"), (r2, "r2")):
            # Drain: no new requests for it; wait for its in-flight ones.
            balancer.command(f"set server moderato/{server} state drain")
            deadline = time.monotonic() + 30
            while balancer.servers()[server][1] > 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            replica.signal("TERM")
            code = replica.wait_exit()
            check(code == 0, f"{server} exited {code} after SIGTERM")
            replica.restart()
            replica.wait_healthy()
            balancer.command(f"set server moderato/{server} state ready")
            balancer.wait_status(server, "UP")
            log(f"replicas: rolling restart: {server} drained, stopped, started, back UP")
        time.sleep(2)
    answers = load.answers
    failed = [a for a in answers if a.status != 200]
    check(not failed, f"{len(failed)} of {len(answers)} requests failed during the rolling restart: {[(a.status, a.body[:80]) for a in failed[:5]]}")
    ids = [a.request_id for a in answers]
    stored = wait_for_rows(database, ids)
    check(stored == set(ids), f"{len(set(ids) - stored)} requests of the rolling restart have no usage row")
    log(f"replicas: rolling restart under load: {len(answers)} requests, none failed, all metered")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--only", choices=["single", "replicas"])
    args = parser.parse_args()
    pepper = secrets.token_hex(32)
    signing_key = signing_key_pem()
    workdir = tempfile.mkdtemp(prefix="ci-image.")
    try:
        if args.only in (None, "single"):
            check_single(args.image, pepper, signing_key)
        if args.only in (None, "replicas"):
            check_replicas(args.image, pepper, signing_key, workdir)
    except CheckFailed as failure:
        print(f"ci-image: FAILED: {failure}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    log("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
