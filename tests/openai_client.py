#!/usr/bin/env python3
"""Drives Moderato's /v1/moderations with the unmodified `openai` Python SDK
(pinned in .ci/run), as a team switching from OpenAI would: only the base
URL and the key change. Used by tests/it/moderations.rs.

Reads one JSON object on stdin: {"base_url": ".../v1", "key": "...",
"bad_key": "...", "limited_key": "...", "png_data_url": "data:image/png;..."}.
Prints one JSON object with what the SDK returned or raised per scenario.
"""
import json
import sys

import openai
from openai import OpenAI


def dump(response):
    """The SDK's parsed object, read back through its typed attributes too."""
    first = response.results[0]
    return {
        "id": response.id,
        "model": response.model,
        "results": [r.model_dump(by_alias=True) for r in response.results],
        # Typed access, as application code reads it.
        "typed_first": {
            "flagged": first.flagged,
            "harassment_threatening": first.categories.harassment_threatening,
            "violence_score": first.category_scores.violence,
            "self_harm_intent_score": first.category_scores.self_harm_intent,
            "sexual_applied": list(first.category_applied_input_types.sexual),
        },
    }


def raised(call):
    try:
        call()
    except openai.APIStatusError as error:
        body = error.body if isinstance(error.body, dict) else {}
        return {
            "raised": type(error).__name__,
            "status": error.status_code,
            "code": getattr(error, "code", None),
            "type": getattr(error, "type", None),
            "message": body.get("message"),
            "retry_after": error.response.headers.get("retry-after"),
        }
    return {"raised": None}


def main():
    given = json.load(sys.stdin)
    client = OpenAI(base_url=given["base_url"], api_key=given["key"], max_retries=0)
    out = {"sdk_version": openai.__version__}

    out["single"] = dump(client.moderations.create(model="omni-moderation-latest", input="I will find you and hurt you"))
    out["strings"] = dump(
        client.moderations.create(
            model="omni-moderation-latest",
            input=["I will find you and hurt you", "what a lovely afternoon for a walk", "you are all worthless"],
        )
    )
    out["parts"] = dump(
        client.moderations.create(
            model="omni-moderation-latest",
            input=[
                {"type": "text", "text": "look at this picture"},
                {"type": "image_url", "image_url": {"url": given["png_data_url"]}},
            ],
        )
    )
    out["remote_image"] = raised(
        lambda: client.moderations.create(
            input=[{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
        )
    )

    bad = OpenAI(base_url=given["base_url"], api_key=given["bad_key"], max_retries=0)
    out["bad_key"] = raised(lambda: bad.moderations.create(input="hello"))

    limited = OpenAI(base_url=given["base_url"], api_key=given["limited_key"], max_retries=0)
    out["limited_first"] = raised(lambda: limited.moderations.create(input="hello"))
    out["limited_second"] = raised(lambda: limited.moderations.create(input="hello"))

    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
