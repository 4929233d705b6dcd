"""Rewrites PP-OCRv4's ONNX detector or recogniser so that ONNX Runtime runs
it with fewer passes over memory; the arithmetic is the same.

The models come from PaddlePaddle's exporter, which spells every PP-LCNetV3
block as a convolution followed by eight elementwise operators, each a full
pass over the activations: the learnable affine block (x·a + b), hard-swish
written out as x·clip(x + 3, 0, 6)/6, and another affine block. Profiled on
ten screenshot lines, those passes took half of the recogniser's time and
the convolutions a third. ONNX Runtime fuses none of them. Three exact
rewrites:

1. conv → ·a → +b: the scalars go into the convolution (W·a, bias·a + b);
2. x·clip(x + 3, 0, 6)/6 becomes x·HardSigmoid(x) (alpha 1/6, beta 1/2, the
   same function in two operators, and ONNX Runtime fuses HardSigmoid into
   the convolution before it);
3. ·c → +d → an unpadded convolution: into that convolution (W·c, and
   bias + d·ΣW per output channel). A padded one keeps them, since its
   padding would see d where the original sees 0.

Outputs agree with the original to about 1e-4 (float rounding). The result
is byte-for-byte reproducible from the pinned input with the pinned onnx and
numpy (scripts/fuse-ocr-requirements.txt): every sum is exactly rounded
(math.fsum), and the file's sha256 is pinned in scripts/fetch-ocr.sh and in
src/moderation/image/ocr.

Usage: python fuse-ocr.py IN.onnx OUT.onnx
"""

import math
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper


class Graph:
    def __init__(self, model):
        self.model = model
        g = model.graph
        self.consts = {}
        for n in g.node:
            if n.op_type == "Constant" and n.attribute[0].name == "value":
                self.consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        for i in g.initializer:
            self.consts[i.name] = numpy_helper.to_array(i)
        self.nodes = [n for n in g.node if n.op_type != "Constant"]
        self.outputs = {o.name for o in g.output}
        self.added = {}
        for k, n in enumerate(self.nodes):
            if not n.name:
                n.name = f"node_{k}"

    def only_user(self, name):
        users = [n for n in self.nodes if name in n.input]
        return users[0] if len(users) == 1 and name not in self.outputs else None

    def scalar(self, name):
        v = self.consts.get(name)
        return None if v is None or v.size != 1 else float(v.ravel()[0])

    @staticmethod
    def other(node, x):
        return node.input[1] if node.input[0] == x else node.input[0]

    def rename_input(self, old, new):
        for n in self.nodes:
            for k, i in enumerate(n.input):
                if i == old:
                    n.input[k] = new

    def conv_params(self, conv):
        w = self.consts[conv.input[1]].astype(np.float32)
        has_bias = len(conv.input) > 2 and conv.input[2]
        b = self.consts[conv.input[2]].astype(np.float32) if has_bias else np.zeros(w.shape[0], np.float32)
        return w, b

    def set_conv_params(self, conv, w, b):
        names = (conv.name + "_fused_w", conv.name + "_fused_b")
        for name, value in zip(names, (w, b)):
            self.added[name] = self.consts[name] = value.astype(np.float32)
        del conv.input[1:]
        conv.input.extend(names)

    def save(self, path):
        g = self.model.graph
        used = {i for n in self.nodes for i in n.input}
        constants = [n for n in g.node if n.op_type == "Constant" and n.output[0] in used]
        initializers = [i for i in g.initializer if i.name in used]
        initializers += [numpy_helper.from_array(v, k) for k, v in self.added.items() if k in used]
        del g.node[:]
        g.node.extend(constants + self.nodes)
        del g.initializer[:]
        g.initializer.extend(initializers)
        onnx.checker.check_model(self.model)
        onnx.save(self.model, path)


def affine_into_conv(g):
    """conv → ·a → +b becomes the convolution alone."""
    done = 0
    for conv in [n for n in g.nodes if n.op_type == "Conv"]:
        mul = g.only_user(conv.output[0])
        if not mul or mul.op_type != "Mul":
            continue
        a = g.scalar(g.other(mul, conv.output[0]))
        add = g.only_user(mul.output[0])
        if a is None or not add or add.op_type != "Add":
            continue
        b = g.scalar(g.other(add, mul.output[0]))
        if b is None:
            continue
        w, bias = g.conv_params(conv)
        g.set_conv_params(conv, w * np.float32(a), bias * np.float32(a) + np.float32(b))
        g.nodes.remove(mul)
        g.nodes.remove(add)
        g.rename_input(add.output[0], conv.output[0])
        done += 1
    return done


def hard_swish(g):
    """x → +3 → clip(0, 6) → ·x → /6 becomes x·HardSigmoid(x)."""
    done = 0
    for add in [n for n in g.nodes if n.op_type == "Add"]:
        if add not in g.nodes:
            continue
        x = next((i for i in add.input if g.scalar(i) is None), None)
        if x is None or g.scalar(g.other(add, x)) != 3.0:
            continue
        clip = g.only_user(add.output[0])
        if not clip or clip.op_type != "Clip" or [g.scalar(i) for i in clip.input[1:]] != [0.0, 6.0]:
            continue
        mul = g.only_user(clip.output[0])
        if not mul or mul.op_type != "Mul" or g.other(mul, clip.output[0]) != x:
            continue
        div = g.only_user(mul.output[0])
        if not div or div.op_type != "Div" or div.input[0] != mul.output[0] or g.scalar(div.input[1]) != 6.0:
            continue
        at = g.nodes.index(add)
        for node in (add, clip, mul, div):
            g.nodes.remove(node)
        gate = add.name + "_hard_sigmoid"
        g.nodes.insert(at, helper.make_node("HardSigmoid", [x], [gate], name=gate, alpha=1 / 6, beta=0.5))
        g.nodes.insert(at + 1, helper.make_node("Mul", [x, gate], [div.output[0]], name=add.name + "_hard_swish"))
        done += 1
    return done


def affine_into_next_conv(g):
    """·c → +d → an unpadded convolution becomes that convolution."""
    done = 0
    for mul in [n for n in g.nodes if n.op_type == "Mul"]:
        if mul not in g.nodes:
            continue
        x = next((i for i in mul.input if g.scalar(i) is None), None)
        if x is None:
            continue
        c = g.scalar(g.other(mul, x))
        add = g.only_user(mul.output[0])
        if c is None or not add or add.op_type != "Add":
            continue
        d = g.scalar(g.other(add, mul.output[0]))
        conv = g.only_user(add.output[0])
        if d is None or not conv or conv.op_type != "Conv" or conv.input[0] != add.output[0]:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
        if any(attrs.get("pads", [0])) or attrs.get("auto_pad", b"NOTSET") != b"NOTSET":
            continue
        w, bias = g.conv_params(conv)
        # Exactly rounded sums, so the file does not depend on the machine's
        # summation order.
        sums = np.array([math.fsum(w[o].astype(np.float64).ravel()) for o in range(w.shape[0])])
        g.set_conv_params(conv, w * np.float32(c), (bias.astype(np.float64) + d * sums).astype(np.float32))
        conv.input[0] = x
        g.nodes.remove(mul)
        g.nodes.remove(add)
        done += 1
    return done


def main():
    source, target = sys.argv[1:3]
    g = Graph(onnx.load(source))
    counts = {f.__name__: f(g) for f in (affine_into_conv, hard_swish, affine_into_next_conv)}
    g.save(target)
    print(f"fuse-ocr: {source} → {target}: {counts}")


if __name__ == "__main__":
    main()
