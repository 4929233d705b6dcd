"""Runs schemathesis' command line (`python -m schemathesis.cli`) with one
workaround for a CPython 3.11 bug.

Hypothesis describes a lambda by parsing its module's source with
`ast.parse`; schemathesis can ask for that description deep inside a
recursive draw, and there CPython 3.11's `ast.parse` fails with
"SystemError: AST constructor recursion depth mismatch" (CPython
gh-106905). The description only names a strategy in a message, so a
failure to write it must not fail the run: it falls back to the name
hypothesis itself uses when it cannot read a lambda's source. Seen in about
one run in three on 2026-11-24 (hypothesis 6.170.17, Python 3.11.7), always
in the coverage phase of `POST /v1/moderations`.
"""

import runpy

from hypothesis.internal import lambda_sources

_describe = lambda_sources.lambda_description


def _describe_or_unknown(f):
    try:
        return _describe(f)
    except SystemError:
        return "lambda: <unknown>"


lambda_sources.lambda_description = _describe_or_unknown
runpy.run_module("schemathesis.cli", run_name="__main__", alter_sys=True)
