// Generates a handful of harmless synthetic images (gradients, shapes, a
// checkerboard, blocky noise), writes them as PNGs under
// tests/fixtures/images/, runs nsfwjs 4.4.0 (MobileNetV2, tfjs pure-JS CPU
// backend) on each and writes the class probabilities to
// tests/fixtures/nsfwjs_reference.json for the Rust port's agreement test.
//
// Usage: cd tools/reference && npm ci && node nsfwjs-reference.mjs
// Deterministic: images come from fixed formulas and a fixed-seed PRNG.

import { mkdirSync, writeFileSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as tf from "@tensorflow/tfjs";
import * as nsfwjs from "nsfwjs";
import { PNG } from "pngjs";

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "../..");
const imageDir = join(repoRoot, "tests/fixtures/images");
const outJson = join(repoRoot, "tests/fixtures/nsfwjs_reference.json");

function makeImage(width, height, pixel) {
  const data = new Uint8Array(width * height * 3);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const [r, g, b] = pixel(x, y);
      const i = (y * width + x) * 3;
      data[i] = r;
      data[i + 1] = g;
      data[i + 2] = b;
    }
  }
  return { width, height, data };
}

function xorshift(seed) {
  let s = seed >>> 0;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s;
  };
}

const clamp = (v) => Math.max(0, Math.min(255, Math.round(v)));

function blockyNoise(width, height, block, seed) {
  const rand = xorshift(seed);
  const cols = Math.ceil(width / block);
  const cells = Array.from({ length: cols * Math.ceil(height / block) }, () => [rand() & 255, rand() & 255, rand() & 255]);
  return makeImage(width, height, (x, y) => cells[Math.floor(y / block) * cols + Math.floor(x / block)]);
}

function shapes(width, height) {
  return makeImage(width, height, (x, y) => {
    const cx = width * 0.35, cy = height * 0.45, r = Math.min(width, height) * 0.22;
    if ((x - cx) ** 2 + (y - cy) ** 2 < r * r) return [230, 190, 40]; // yellow disc
    if (x > width * 0.6 && x < width * 0.9 && y > height * 0.55 && y < height * 0.85) return [200, 40, 40]; // red box
    if (y > height * 0.8) return [60, 140, 60]; // green ground
    return [110, 160, 220]; // sky
  });
}

const IMAGES = {
  gradient_horizontal: makeImage(224, 224, (x) => [clamp((x * 255) / 223), clamp((x * 255) / 223), clamp((x * 255) / 223)]),
  gradient_color: makeImage(224, 224, (x, y) => [clamp((x * 255) / 223), clamp((y * 255) / 223), clamp(255 - ((x + y) * 255) / 446)]),
  checkerboard: makeImage(224, 224, (x, y) => ((Math.floor(x / 28) + Math.floor(y / 28)) % 2 ? [240, 240, 240] : [20, 20, 20])),
  shapes: shapes(224, 224),
  noise_blocks: blockyNoise(224, 224, 8, 0x9e3779b9),
  flat_grey: makeImage(224, 224, () => [128, 128, 128]),
  stripes: makeImage(224, 224, (x, y) => (Math.floor((x + y) / 12) % 2 ? [30, 60, 200] : [250, 220, 90])),
  // Not 224×224: exercises nsfwjs's own resize (resizeBilinear, alignCorners).
  shapes_320x240: shapes(320, 240),
};

function writePng(path, img) {
  const png = new PNG({ width: img.width, height: img.height, colorType: 2, inputColorType: 2, inputHasAlpha: false });
  png.data = Buffer.from(img.data);
  writeFileSync(path, PNG.sync.write(png, { colorType: 2, inputColorType: 2, inputHasAlpha: false, deflateLevel: 9 }));
}

function readPngRgb(path) {
  const png = PNG.sync.read(readFileSync(path));
  const rgb = new Int32Array(png.width * png.height * 3);
  for (let i = 0, j = 0; i < png.data.length; i += 4, j += 3) {
    rgb[j] = png.data[i];
    rgb[j + 1] = png.data[i + 1];
    rgb[j + 2] = png.data[i + 2];
  }
  return { width: png.width, height: png.height, rgb };
}

async function main() {
  await tf.setBackend("cpu");
  const model = await nsfwjs.load("MobileNetV2");
  mkdirSync(imageDir, { recursive: true });
  const results = {};
  for (const [name, img] of Object.entries(IMAGES)) {
    const file = `${name}.png`;
    writePng(join(imageDir, file), img);
    // Read back what was written, so the reference is computed from exactly
    // the pixels the Rust test decodes.
    const { width, height, rgb } = readPngRgb(join(imageDir, file));
    const input = tf.tensor3d(rgb, [height, width, 3], "int32");
    const output = model.infer(input);
    const probs = Array.from(await output.data());
    output.dispose();
    input.dispose();
    results[file] = { width, height, probabilities: probs };
    console.log(file, probs.map((p) => p.toFixed(5)).join(" "));
  }
  const doc = {
    generator: "tools/reference/nsfwjs-reference.mjs",
    nsfwjs: "4.4.0",
    model: "MobileNetV2",
    tfjs: tf.version.tfjs,
    backend: tf.getBackend(),
    classes: ["Drawing", "Hentai", "Neutral", "Porn", "Sexy"],
    images: results,
  };
  writeFileSync(outJson, JSON.stringify(doc, null, 2) + "\n");
  console.log(`wrote ${outJson}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
