#!/usr/bin/env python3
"""Independent verifier of Moderato's response signatures (RFC 9421 with
Ed25519 over an RFC 9530 Content-Digest), used by the integration tests.

Reads one JSON object on stdin: {"jwks": {...}, "status": 200,
"headers": {"name": "value", ...}, "body_b64": "...", "request": {"method":
"POST", "path": "/v1/moderate", "body_b64": "...", "nonce": "..." or null}}:
the response, and the request the client sent and takes it as the answer
to. Exits 0 when the signature verifies for that request, 1 otherwise (with
the reason on stdout).
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


def content_digest(data):
    return "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"


def verify(message):
    headers = {k.lower(): v for k, v in message["headers"].items()}
    request = message["request"]
    body = base64.b64decode(message["body_b64"])
    if headers.get("content-digest") != content_digest(body):
        return "content-digest does not match the body"
    match = re.fullmatch(
        r'sig1=(\(((?:"[^"]+"(?:;req)?\s*)*)\)(?:;[a-z]+=(?:"[^"]*"|\d+))*)',
        headers.get("signature-input", ""),
    )
    if not match:
        return "unexpected Signature-Input"
    params = match.group(1)
    covered = re.findall(r'"[^"]+"(?:;req)?', match.group(2))
    # What must be covered for the response to answer *this* request.
    required = ['"@method";req', '"@path";req']
    if 200 <= message["status"] < 300:
        required.append('"content-digest";req')
    if request.get("nonce") is not None:
        required.append('"x-client-nonce"')
        if headers.get("x-client-nonce") != request["nonce"]:
            return "the nonce is not echoed"
    missing = [c for c in required if c not in covered]
    if missing:
        return f"the signature does not cover {missing}"
    request_values = {
        '"@method";req': request["method"],
        '"@path";req': request["path"],
        '"content-digest";req': content_digest(base64.b64decode(request["body_b64"])),
    }
    lines = []
    for component in covered:
        if component == '"@status"':
            value = str(message["status"])
        elif component in request_values:
            value = request_values[component]
        elif component.endswith(";req"):
            return f"unknown request component {component}"
        else:
            value = headers[component.strip('"')]
        lines.append(f"{component}: {value.strip()}")
    lines.append(f'"@signature-params": {params}')
    base = "\n".join(lines).encode()
    keyid = re.search(r';keyid="([^"]+)"', params).group(1)
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
