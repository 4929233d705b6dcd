#!/usr/bin/env node
// Converts the nsfwjs MobileNetV2 bundle (a Keras layers model for tfjs whose
// weights are uint8 with a per-tensor min and scale, base64 inside
// dist/models/mobilenet_v2/*.min.js) into a safetensors file of f32 tensors
// that the Rust service loads.
//
// Usage: node scripts/convert-nsfwjs.mjs <unpacked nsfwjs package dir> <output .safetensors>
//
// Dequantisation is the one tfjs performs when it loads the model
// (value = q * scale + min, computed in double and stored as f32), so the
// Rust port starts from exactly the weights nsfwjs runs with. Names and
// shapes are kept as Keras wrote them (HWIO kernels); the Rust loader does
// the layout changes. Needs Node ≥ 18 and nothing from npm.

import { createRequire } from "node:module";
import { writeFileSync, renameSync } from "node:fs";
import { join, resolve } from "node:path";

const [pkgDir, outPath] = process.argv.slice(2);
if (!pkgDir || !outPath) {
  console.error("usage: convert-nsfwjs.mjs <nsfwjs package dir> <output.safetensors>");
  process.exit(2);
}

const require = createRequire(import.meta.url);
const modelDir = join(resolve(pkgDir), "dist/models/mobilenet_v2");
const unwrap = (m) => (m && m.default ? m.default : m);
const modelJson = unwrap(require(join(modelDir, "model.min.js")));
const shardBase64 = unwrap(require(join(modelDir, "group1-shard1of1.min.js")));
if (typeof shardBase64 !== "string") throw new Error("unexpected weight bundle format");

const manifest = modelJson.weightsManifest;
if (!Array.isArray(manifest) || manifest.length !== 1 || manifest[0].paths.length !== 1) {
  throw new Error("expected one weight group with one shard");
}
const shard = Buffer.from(shardBase64, "base64");

const header = {
  __metadata__: {
    source: "nsfwjs@4.4.0 dist/models/mobilenet_v2 (MIT)",
    converter: "scripts/convert-nsfwjs.mjs",
    layout: "keras (HWIO conv kernels, HW C 1 depthwise kernels, in×out dense kernels)",
  },
};
const chunks = [];
let inOffset = 0;
let outOffset = 0;
for (const spec of manifest[0].weights) {
  const count = spec.shape.reduce((a, b) => a * b, 1);
  const q = spec.quantization;
  if (spec.dtype !== "float32" || !q || q.dtype !== "uint8") {
    throw new Error(`unsupported weight encoding for ${spec.name}: ${JSON.stringify(spec)}`);
  }
  if (inOffset + count > shard.length) throw new Error(`weight data ends before ${spec.name}`);
  const values = new Float32Array(count);
  for (let i = 0; i < count; i++) values[i] = shard[inOffset + i] * q.scale + q.min;
  inOffset += count;
  const bytes = Buffer.from(values.buffer);
  header[spec.name] = { dtype: "F32", shape: spec.shape, data_offsets: [outOffset, outOffset + bytes.length] };
  chunks.push(bytes);
  outOffset += bytes.length;
}
if (inOffset !== shard.length) throw new Error(`${shard.length - inOffset} unused bytes of weight data`);

let headerJson = JSON.stringify(header);
headerJson += " ".repeat((8 - (headerJson.length % 8)) % 8);
const len = Buffer.alloc(8);
len.writeBigUInt64LE(BigInt(Buffer.byteLength(headerJson)));
const tmp = `${outPath}.tmp`;
writeFileSync(tmp, Buffer.concat([len, Buffer.from(headerJson), ...chunks]));
renameSync(tmp, outPath);
const params = outOffset / 4;
console.log(`wrote ${outPath}: ${manifest[0].weights.length} tensors, ${params} parameters`);
