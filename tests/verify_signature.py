#!/usr/bin/env python3
"""Independent verifier of Moderato's response signatures (RFC 9421 with
Ed25519 over an RFC 9530 Content-Digest), used by the integration tests.

Reads one JSON object on stdin: {"jwks": {...}, "status": 200,
"headers": {"name": "value", ...}, "body_b64": "..."}. Exits 0 when the
signature verifies, 1 otherwise (with the reason on stdout).
"""
import base64
import hashlib
import json
import re
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def b64url_decode(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify(message):
    headers = {k.lower(): v for k, v in message["headers"].items()}
    body = base64.b64decode(message["body_b64"])
    digest = "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode() + ":"
    if headers.get("content-digest") != digest:
        return "content-digest does not match the body"
    match = re.fullmatch(r'sig1=(\((?:"[^"]+"\s*)*\)(?:;[a-z]+=(?:"[^"]*"|\d+))*)', headers["signature-input"])
    if not match:
        return "unexpected Signature-Input"
    params = match.group(1)
    components = re.findall(r'"([^"]+)"', params[: params.index(")")])
    keyid = re.search(r';keyid="([^"]+)"', params).group(1)
    lines = []
    for name in components:
        value = str(message["status"]) if name == "@status" else headers[name]
        lines.append(f'"{name}": {value.strip()}')
    lines.append(f'"@signature-params": {params}')
    base = "\n".join(lines).encode()
    signature = base64.b64decode(re.fullmatch(r"sig1=:([^:]+):", headers["signature"]).group(1))
    keys = [k for k in message["jwks"]["keys"] if k["kid"] == keyid]
    if not keys:
        return f"no published key {keyid}"
    public = Ed25519PublicKey.from_public_bytes(b64url_decode(keys[0]["x"]))
    try:
        public.verify(signature, base)
    except InvalidSignature:
        return "signature does not verify"
    return None


if __name__ == "__main__":
    reason = verify(json.load(sys.stdin))
    print(reason or "ok")
    sys.exit(1 if reason else 0)
