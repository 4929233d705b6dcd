"""A real SMTP server on loopback for the sign-up tests (aiosmtpd, pinned in
.ci/run). It listens on a free port of 127.0.0.1, prints {"port": N} on its
first line, then one JSON line per message received: the envelope's sender
and recipients, the subject and the plain-text body as a mail reader would
show it (transfer encoding undone). With --refuse it answers every message
with 554, as a server that will not relay would. It stops when stdin
closes (the test that started it is done).
"""

import asyncio
import email
import email.policy
import json
import socket
import sys

from aiosmtpd.smtp import SMTP


class Sink:
    def __init__(self, refuse: bool):
        self.refuse = refuse

    async def handle_DATA(self, server, session, envelope):
        if self.refuse:
            return "554 5.7.1 Relay access denied"
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        body = message.get_body(("plain",))
        print(
            json.dumps(
                {
                    "from": envelope.mail_from,
                    "to": envelope.rcpt_tos,
                    "subject": str(message["subject"]),
                    "body": body.get_content() if body is not None else "",
                }
            ),
            flush=True,
        )
        return "250 OK"


async def main() -> None:
    refuse = "--refuse" in sys.argv[1:]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(Sink(refuse)), sock=sock)
    print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
    # Until stdin closes.
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()


asyncio.run(main())
