"""The fine-tuned e5 file as a small delta on the pinned one.

The fine-tuned file (train/finetune_e5.py) keeps the pinned file's layout,
vocabulary, embeddings and every 4-bit block scale: only the layers' codes
that training moved, and their f32 biases and layer norms, differ. Its XOR
with the pinned file is therefore mostly zero bytes, and xz makes it small
enough to keep in the repository (run 2 of eval/ABLATION-real.md: 862 KB),
where the whole fine-tuned file (72 MB) could not be. This is how the
fine-tuned encoder ships (heads 2026-11-29.21): the delta in
assets/text-model/e5-finetuned.delta.xz, and scripts/fetch-e5.sh rebuilding
the file from the pinned one and checking its sha256.

Standard library only (the setup step runs it with the machine's python3).

  python3 e5_delta.py make  PINNED.bin FINETUNED.bin DELTA.xz
  python3 e5_delta.py apply PINNED.bin DELTA.xz OUT.bin
"""

import hashlib
import lzma
import sys
from pathlib import Path


def xor(a: bytes, b: bytes) -> bytes:
    if len(a) != len(b):
        raise SystemExit(f"e5_delta: sizes differ ({len(a)} and {len(b)} bytes): not the same layout")
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")


def make(pinned: Path, finetuned: Path, delta: Path) -> None:
    d = xor(pinned.read_bytes(), finetuned.read_bytes())
    delta.write_bytes(lzma.compress(d, preset=9 | lzma.PRESET_EXTREME))
    changed = len(d) - d.count(0)
    print(f"e5_delta: {changed} of {len(d)} bytes differ; {delta} is {delta.stat().st_size} bytes")
    print(f"e5_delta: sha256 of the fine-tuned file {hashlib.sha256(finetuned.read_bytes()).hexdigest()}")


def apply(pinned: Path, delta: Path, out: Path) -> None:
    data = xor(pinned.read_bytes(), lzma.decompress(delta.read_bytes()))
    tmp = out.with_suffix(out.suffix + ".part")
    tmp.write_bytes(data)
    tmp.replace(out)


def main(argv):
    if len(argv) != 5 or argv[1] not in ("make", "apply"):
        raise SystemExit(__doc__)
    (make if argv[1] == "make" else apply)(*map(Path, argv[2:]))


if __name__ == "__main__":
    main(sys.argv)
