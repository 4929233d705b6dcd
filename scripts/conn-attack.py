#!/usr/bin/env python3
"""Issue 58's connection attack, on loopback only and bounded in time:
sockets from one address (127.0.0.2) post a form declaring 100,000 bytes to
/dashboard/login and trickle a byte a second after its 413, while another
address (127.0.0.1) asks for /health on a fresh connection every half
second. Prints each /health time (or "timeout").

    python3 scripts/conn-attack.py PORT [SOCKETS] [SECONDS] [--then N]

SOCKETS (default 16) are opened first; with --then N, N more are opened
after 2 s. Only 127.0.0.0/8 is ever contacted.
"""

import asyncio
import sys
import time

HEAD = (
    b"POST /dashboard/login HTTP/1.1\r\nHost: test\r\n"
    b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n"
)
HEALTH = b"GET /health HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"


async def trickle(port, stop):
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=("127.0.0.2", 0)
        )
    except OSError:
        return "refused"
    try:
        writer.write(HEAD)
        await writer.drain()
        while not stop.is_set():
            await asyncio.sleep(1)
            writer.write(b"a")
            await writer.drain()
    except OSError:
        return "closed"
    finally:
        writer.close()
    return "held"


async def health(port, bound):
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), bound
        )
        writer.write(HEALTH)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), bound)
        writer.close()
        status = line.split()[1].decode() if line else "closed"
    except (asyncio.TimeoutError, OSError):
        return None, "timeout"
    return time.monotonic() - started, status


async def main():
    port = int(sys.argv[1])
    sockets = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 20
    then = int(sys.argv[sys.argv.index("--then") + 1]) if "--then" in sys.argv else 0
    stop = asyncio.Event()
    tasks = [asyncio.create_task(trickle(port, stop)) for _ in range(sockets)]
    await asyncio.sleep(1.5)
    start = time.monotonic()
    times = []
    while time.monotonic() - start < seconds:
        if then and time.monotonic() - start >= 2 and len(tasks) == sockets:
            tasks += [asyncio.create_task(trickle(port, stop)) for _ in range(then)]
        took, status = await health(port, 5.0)
        elapsed = time.monotonic() - start
        print(f"t={elapsed:5.1f}s /health {status} "
              + (f"{took * 1000:.1f} ms" if took is not None else "(no answer within 5 s)"),
              flush=True)
        times.append(took)
        await asyncio.sleep(0.5)
    stop.set()
    outcomes = await asyncio.gather(*tasks)
    answered = [t for t in times if t is not None]
    print(f"attack sockets: {len(tasks)}; outcomes: "
          + ", ".join(f"{o} {outcomes.count(o)}" for o in sorted(set(outcomes))))
    print(f"/health: {len(answered)} of {len(times)} answered; "
          + (f"max {max(answered) * 1000:.1f} ms" if answered else "none"))


asyncio.run(main())
