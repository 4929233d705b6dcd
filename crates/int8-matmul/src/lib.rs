//! 8-bit matrix multiplication for the text encoder's dense layers.
//!
//! Weights and activations are both quantised symmetrically in blocks of 32
//! along the shared dimension, each block with its own f32 scale, so one
//! large value only coarsens its own block. Products of 8-bit values are
//! summed exactly in integers and scaled once per block.
//!
//! Why: the f32 weights of MiniLM's dense layers (42 MB) do not fit in this
//! class of machine's cache, so every forward pass streams them from memory;
//! for a short message that took most of the time. As 8-bit blocks they are
//! 11 MB and stay cached.

#[cfg(test)]
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use rayon::prelude::*;

mod amx;
pub mod attention;
pub mod ops;
mod simd;

thread_local! {
    /// Products and attention batches this thread has split across the
    /// pool: what the tests observe.
    #[cfg(test)]
    static SPLITS: Cell<usize> = const { Cell::new(0) };
}

/// Calls ([`Call`]) that will run products, running or waiting for cores.
static CALLS: AtomicUsize = AtomicUsize::new(0);

/// A call that runs products (a request's encoder passes), counted while
/// it lives. While more than one is counted, each product and attention
/// batch stays on the thread that starts it, however large; the results
/// are the same bits.
///
/// Why: splitting a product across the cores nearly halves the latency
/// of a request that is alone, but when other requests are waiting for
/// the same cores it only adds the cost of handing work over and waiting
/// for it. It is decided per product, so a request that started alone
/// stops splitting as soon as another arrives.
#[must_use = "the call is counted only while the value lives"]
pub struct Call(());

impl Call {
    pub fn enter() -> Call {
        CALLS.fetch_add(1, Ordering::Relaxed);
        Call(())
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        CALLS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether a product of `work` multiply-adds should be split across the
/// pool: not when it is small (waking a second thread costs more than it
/// saves) nor while other calls wait for the cores.
fn split(work: usize, at_least: usize) -> bool {
    let worth_it = work >= at_least && CALLS.load(Ordering::Relaxed) <= 1;
    #[cfg(test)]
    if worth_it {
        SPLITS.set(SPLITS.get() + 1);
    }
    worth_it
}

/// Values per quantisation block.
pub const BLOCK: usize = 32;

/// The kernels. For a matrix of any [`Form`], all of them sum the same
/// exact integer products per block and scale them in the same order, so
/// they give bit-identical results: embeddings do not depend on the CPU's
/// features. Listed from the narrowest to the widest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kernel {
    /// Plain Rust loops: any CPU.
    Portable,
    /// 16-bit multiply-adds (`vpmaddwd`, `vpmaddubsw`) on 256-bit registers.
    Avx2,
    /// 8-bit dot products (`vpdpbusd`, VEX-encoded AVX-VNNI) on 256-bit
    /// registers: Intel since Alder Lake / Sapphire Rapids, AMD since Zen 5.
    AvxVnni,
    /// 8-bit dot products (`vpdpbusd`, AVX-512 VNNI) on 512-bit registers,
    /// sixteen output columns at a time: Intel since Ice Lake, AMD since Zen 4.
    Avx512Vnni,
    /// AMX tiles (`tdpbssd`, 16 rows x 16 columns x one block per
    /// instruction), with the AVX-512 VNNI kernel's scaling and its kernels
    /// for the shapes tiles do not fit: Intel since Sapphire Rapids. Only
    /// when Linux grants the tile state and a start-up self-check against
    /// the portable kernel passes (see [`amx::works`]).
    Amx,
}

impl Kernel {
    /// Every kernel, narrowest first.
    pub const ALL: [Kernel; 5] = [
        Kernel::Portable,
        Kernel::Avx2,
        Kernel::AvxVnni,
        Kernel::Avx512Vnni,
        Kernel::Amx,
    ];

    /// The name `text_model.cpu_kernel` and the logs use.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::AvxVnni => "avxvnni",
            Kernel::Avx512Vnni => "avx512vnni",
            Kernel::Amx => "amx",
        }
    }

    /// The CPU features the kernel needs, as Linux's `/proc/cpuinfo` and
    /// `is_x86_feature_detected!` name them (for error messages).
    pub fn needs(self) -> &'static str {
        match self {
            Kernel::Portable => "nothing",
            Kernel::Avx2 => "avx2 and fma",
            Kernel::AvxVnni => "avx2, fma and avxvnni",
            Kernel::Avx512Vnni => "avx2, fma, avx512f, avx512vl and avx512vnni",
            Kernel::Amx => {
                "avx2, fma, avx512f, avx512vl, avx512vnni, amx-tile and amx-int8, on \
                 Linux 5.16 or later (which grants the tile state)"
            }
        }
    }

    /// Whether this CPU can run the kernel. The `unsafe` calls of each
    /// kernel rely on this check alone.
    pub fn is_supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma");
            match self {
                Kernel::Portable => true,
                Kernel::Avx2 => avx2,
                Kernel::AvxVnni => avx2 && has!("avxvnni"),
                Kernel::Avx512Vnni => {
                    avx2 && has!("avx512f") && has!("avx512vl") && has!("avx512vnni")
                }
                Kernel::Amx => Kernel::Avx512Vnni.is_supported() && amx::works(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Kernel::Portable
        }
    }

    /// The kernels this CPU can run, narrowest first.
    pub fn available() -> Vec<Kernel> {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.is_supported())
            .collect()
    }

    /// The widest kernel this CPU can run.
    /// The fastest kernel this CPU runs. AMX is not among those `auto`
    /// picks: with one 32-wide block per tile product (each block has its
    /// own scales) it measured slower than AVX-512 VNNI on this project's
    /// Xeon (Criterion, one MiniLM layer, quiet machine: 117 against 74 µs
    /// at 4 tokens, 2.50 against 2.25 ms at 128; e5 2.38 against 1.95 ms at
    /// 128), so it is only used when `text_model.cpu_kernel = "amx"` asks.
    fn best_of_cpu() -> Kernel {
        Kernel::available()
            .into_iter()
            .rfind(|k| *k != Kernel::Amx)
            .expect("the portable kernel runs anywhere")
    }

    /// Whether the kernel multiplies [`Form::Rows`] with 8-bit dot
    /// products, reading offset activations in [`VNNI_ORDER`].
    fn offset_rows(self) -> bool {
        matches!(self, Kernel::AvxVnni | Kernel::Avx512Vnni | Kernel::Amx)
    }

    /// The kernel the process uses (see [`choose_kernel`]).
    fn detect() -> Kernel {
        static DETECTED: OnceLock<Kernel> = OnceLock::new();
        *DETECTED.get_or_init(|| match choice() {
            KernelChoice::Auto => Kernel::best_of_cpu(),
            KernelChoice::Force(kernel) => kernel,
        })
    }
}

/// What `text_model.cpu_kernel` asks for: the best kernel the CPU has, or
/// one kernel by name (to measure it, or to rule out an instruction set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelChoice {
    /// The widest kernel the CPU can run.
    Auto,
    /// This kernel, or a startup error if the CPU lacks it.
    Force(Kernel),
}

impl KernelChoice {
    /// The choice named by the environment variable `var`; `Auto` when it
    /// is not set. For benchmarks and examples, which read the service's
    /// `MODERATO_TEXT_MODEL__CPU_KERNEL`.
    pub fn from_env(var: &str) -> Result<KernelChoice, String> {
        match std::env::var(var) {
            Err(_) => Ok(KernelChoice::Auto),
            Ok(v) => v.parse(),
        }
    }
}

impl std::str::FromStr for KernelChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<KernelChoice, String> {
        match s {
            "auto" => Ok(KernelChoice::Auto),
            other => Kernel::ALL
                .into_iter()
                .find(|k| k.name() == other)
                .map(KernelChoice::Force)
                .ok_or_else(|| {
                    format!(
                        "{other:?} is not a CPU kernel: expected auto, amx, avx512vnni, \
                         avxvnni, avx2 or portable"
                    )
                }),
        }
    }
}

/// Why [`choose_kernel`] refused a choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChoiceError {
    /// The kernels were already chosen differently in this process.
    AlreadyChosen { kept: Kernel },
    /// The CPU (or, for AMX, the operating system or the start-up
    /// self-check) cannot run the forced kernel.
    Unsupported(Kernel),
}

impl std::fmt::Display for ChoiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChoiceError::AlreadyChosen { kept } => write!(
                f,
                "the CPU kernel was already chosen in this process ({})",
                kept.name()
            ),
            ChoiceError::Unsupported(k) => write!(
                f,
                "this CPU cannot run the {} kernel (it needs {}); use \"auto\" or one of: {}",
                k.name(),
                k.needs(),
                Kernel::available()
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl std::error::Error for ChoiceError {}

static CHOICE: OnceLock<KernelChoice> = OnceLock::new();

fn choice() -> KernelChoice {
    *CHOICE.get_or_init(|| KernelChoice::Auto)
}

/// Chooses the kernel for the whole process and returns it. Call it before
/// the first matrix is quantised: the choice is made once, at that point,
/// and a later call that would change it fails. A forced kernel the CPU
/// lacks is refused (nothing is chosen then).
pub fn choose_kernel(wanted: KernelChoice) -> Result<Kernel, ChoiceError> {
    match wanted {
        KernelChoice::Force(kernel) if !kernel.is_supported() => {
            return Err(ChoiceError::Unsupported(kernel))
        }
        _ => {}
    }
    let kept = match CHOICE.set(wanted) {
        Ok(()) => return Ok(Kernel::detect()),
        Err(_) => Kernel::detect(),
    };
    let same = match wanted {
        KernelChoice::Auto => kept == Kernel::best_of_cpu(),
        KernelChoice::Force(kernel) => kept == kernel,
    };
    if same {
        Ok(kept)
    } else {
        Err(ChoiceError::AlreadyChosen { kept })
    }
}

/// The kernel in use, by name, for logs and benchmark reports.
pub fn kernel_name() -> &'static str {
    Kernel::detect().name()
}

/// A matrix of `rows x cols` weights (`cols` a multiple of [`BLOCK`]),
/// row-major, as `i8` values with one scale per block of a row.
pub struct Int8Matrix {
    rows: usize,
    cols: usize,
    kernel: Kernel,
    form: Form,
    /// Output columns interleaved ([`Form::Narrow`], [`Form::Grouped`]):
    /// [`GROUP`], or [`WIDE_GROUP`] for the AVX-512 VNNI kernel.
    group: usize,
    /// [`Form::Rows`]: row-major, in the kernel's order (see
    /// [`VNNI_ORDER`]). [`Form::Narrow`] and [`Form::Grouped`]: `group`
    /// columns interleaved (see [`interleave`] and [`Layout`]).
    values: Vec<i8>,
    /// One per block of a row, in the order of `values`.
    scales: Vec<f32>,
    /// The AMX layout only: `-128 x` the sum of each column's weights in
    /// each block, in the order of `scales`, with which the AVX-512 VNNI
    /// instruction multiplies signed weights by activations offset to
    /// unsigned bytes (for the rows too few to fill a tile).
    offset_sums: Vec<i32>,
}

/// How a matrix's weights are stored and multiplied. Chosen from the
/// weights' values and shape alone, never from the CPU, so every kernel of
/// one form gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// Any 8-bit weights, row by row: each product sums eight lanes per
    /// block, scaled one by one, then across. For matrices whose rows are
    /// not a multiple of [`GROUP`] (neither encoder has any); it alone has
    /// a VNNI kernel.
    Rows,
    /// Weights in `[-8, 8]` (4-bit weights widened, as e5's are) and rows
    /// a multiple of [`GROUP`]: one vector holds four weights of each of
    /// eight output columns, multiplied against four broadcast
    /// activations, so a block's whole sum is an exact integer per column
    /// and is scaled once, eight columns in one instruction, with no sum
    /// across lanes at the end.
    ///
    /// Why: the row form spends about as many instructions scaling and
    /// summing lanes as multiplying; for weights this small, 16-bit sums
    /// of a whole block cannot overflow (`16 x 127 x 16 = 32,512`), so
    /// the AVX2 kernel can use byte multiply-adds and scale once per block.
    Narrow,
    /// Any 8-bit weights (MiniLM's), rows a multiple of [`GROUP`]: one
    /// vector holds two weights of each of eight output columns, widened to
    /// 16 bits and multiplied against two broadcast activations
    /// (`vpmaddwd`); as in [`Form::Narrow`], a block's sum is an exact
    /// integer per column, scaled once for eight columns. On a 2-core AMD
    /// EPYC (Zen 3, AVX2) a MiniLM layer's products for 20 tokens took
    /// 702 µs against the row form's 1,108 µs.
    Grouped,
}

/// Output columns interleaved in a [`Form::Narrow`] or [`Form::Grouped`] matrix.
const GROUP: usize = 8;

/// Output columns interleaved for the AVX-512 VNNI kernel: one 512-bit
/// register holds four weights of each of sixteen columns.
const WIDE_GROUP: usize = 16;

/// What the VNNI kernels add to [`Form::Grouped`] weights so that they are
/// bytes `vpdpbusd` reads as unsigned (`-128..=127` becomes `0..=255`).
const GROUPED_VNNI_OFFSET: i32 = 128;

/// How the weights of a [`Form::Narrow`] or [`Form::Grouped`] matrix are
/// interleaved for its kernel (see [`interleave`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    /// Consecutive weights of one column side by side.
    width: usize,
    /// Columns side by side.
    group: usize,
    /// Added to every weight so it reads as an unsigned byte (0: signed).
    offset: i32,
}

impl Layout {
    /// The layout `kernel` multiplies `form` in, for a matrix of `rows`.
    ///
    /// The VNNI kernels multiply both forms the same way: weights plus an
    /// offset, as unsigned bytes, four per column and lane (`vpdpbusd`),
    /// against signed activations, and start each block's sums at minus the
    /// offset times the activations' block sum, so the sums are the exact
    /// integers the portable kernel computes.
    ///
    /// The AMX kernel multiplies signed bytes by signed bytes (`tdpbssd`),
    /// so its weights carry no offset: sixteen columns, four weights each
    /// per 64-byte step, which is a tile of `tdpbssd`'s second operand as
    /// it lies. Matrices whose rows are not a multiple of sixteen (and the
    /// row form) it leaves to the AVX-512 VNNI kernel, in that one's layout.
    fn of(form: Form, kernel: Kernel, rows: usize) -> Layout {
        if kernel == Kernel::Amx {
            if form != Form::Rows && rows.is_multiple_of(WIDE_GROUP) {
                return Layout {
                    width: 4,
                    group: WIDE_GROUP,
                    offset: 0,
                };
            }
            return Layout::of(form, Kernel::Avx512Vnni, rows);
        }
        let vnni = matches!(kernel, Kernel::AvxVnni | Kernel::Avx512Vnni);
        let group = if kernel == Kernel::Avx512Vnni && rows.is_multiple_of(WIDE_GROUP) {
            WIDE_GROUP
        } else {
            GROUP
        };
        match form {
            Form::Narrow => Layout {
                width: 4,
                group,
                offset: NARROW_OFFSET,
            },
            Form::Grouped if vnni => Layout {
                width: 4,
                group,
                offset: GROUPED_VNNI_OFFSET,
            },
            Form::Grouped | Form::Rows => Layout {
                width: 2,
                group: GROUP,
                offset: 0,
            },
        }
    }

    /// Whether the activations are signed bytes with their block sums
    /// ([`RowValues::Signed`]).
    fn signed_activations(self) -> bool {
        self.width == 4
    }
}

/// What [`Form::Narrow`] adds to each weight so that it is a byte the
/// multiply-add instructions read as unsigned.
const NARROW_OFFSET: i32 = 8;

/// Activations `m x k`, quantised like the weights, in the form the
/// matrix's kernel multiplies (borrowed from a [`Scratch`]).
struct Int8Rows<'a> {
    k: usize,
    values: RowValues<'a>,
    scales: &'a [f32],
}

enum RowValues<'a> {
    /// Widened to `i16`, natural order (portable and AVX2 kernels).
    Wide(&'a [i16]),
    /// Offset by 128 to `u8` (the VNNI instruction multiplies unsigned by
    /// signed bytes) and in [`VNNI_ORDER`].
    Offset(&'a [u8]),
    /// Signed bytes, natural order, with each block's sum
    /// ([`Form::Narrow`]: it takes the weights' offset back out).
    Signed { values: &'a [i8], sums: &'a [i32] },
}

/// Buffers for the quantised activations, kept by the caller between
/// products so that a forward pass allocates nothing per layer.
#[derive(Default)]
pub struct Scratch {
    wide: Vec<i16>,
    offset: Vec<u8>,
    signed: Vec<i8>,
    sums: Vec<i32>,
    scales: Vec<f32>,
}

/// What is applied to each output value after the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Identity,
    /// BERT's exact (erf) GELU, see [`ops::gelu_in_place`].
    Gelu,
}

/// The output matrix as the column tasks see it: each writes only its own
/// columns, so tasks never touch the same value.
#[derive(Clone, Copy)]
struct OutPtr {
    ptr: *mut f32,
    /// Values per output row.
    ld: usize,
}

// SAFETY: tasks given an `OutPtr` write disjoint column ranges of a buffer
// that outlives them (see `Int8Matrix::matmul_with`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Position `p` of a stored VNNI block holds element `VNNI_ORDER[p]`: lane
/// `j` (bytes `4j..4j+4`) then sums elements `2j, 2j+1, 16+2j, 17+2j`,
/// which is what lane `j` of the AVX2 kernel's two `vpmaddwd` sums.
const VNNI_ORDER: [usize; BLOCK] = {
    let mut order = [0; BLOCK];
    let mut j = 0;
    while j < 8 {
        order[4 * j] = 2 * j;
        order[4 * j + 1] = 2 * j + 1;
        order[4 * j + 2] = 16 + 2 * j;
        order[4 * j + 3] = 17 + 2 * j;
        j += 1;
    }
    order
};

fn permute_blocks<T: Copy>(values: &mut [T]) {
    for block in values.chunks_exact_mut(BLOCK) {
        let natural: [T; BLOCK] = block.try_into().expect("a whole block");
        for (slot, &from) in block.iter_mut().zip(&VNNI_ORDER) {
            *slot = natural[from];
        }
    }
}

/// The order of [`Form::Narrow`] and [`Form::Grouped`] for row-major
/// weights and their block scales (see [`Layout::of`]: for the portable and
/// AVX2 kernels, narrow is `width` 4 with `offset` [`NARROW_OFFSET`] and
/// grouped `width` 2 with `offset` 0, both in groups of [`GROUP`]). For
/// output columns `G*g..G*g+G` (`G` = `layout.group`), block `b` is `32 G`
/// bytes: step `s` holds, for each column `c` in turn, its `width` weights
/// from `32b + width * s`, plus `offset`. The block's scales follow the
/// same order, `G` columns together.
fn interleave(
    values: &[i8],
    scales: &[f32],
    (rows, cols): (usize, usize),
    layout: Layout,
) -> (Vec<i8>, Vec<f32>) {
    let Layout {
        width,
        group,
        offset,
    } = layout;
    let blocks = cols / BLOCK;
    let mut out = vec![0i8; values.len()];
    let mut out_scales = vec![0f32; scales.len()];
    for n in 0..rows {
        let (g, c) = (n / group, n % group);
        for b in 0..blocks {
            let group_block = g * blocks + b;
            out_scales[group_block * group + c] = scales[n * blocks + b];
            let base = group_block * group * BLOCK;
            for i in 0..BLOCK {
                let at = base + (i / width) * group * width + c * width + i % width;
                // As a byte: the offset kernels read it unsigned (0..=255).
                out[at] = (values[n * cols + b * BLOCK + i] as i32 + offset) as u8 as i8;
            }
        }
    }
    (out, out_scales)
}

/// Quantises `src` block by block to `[-127, 127]` (as `T`), with one
/// scale per block. An all-zero or non-finite block becomes zeros with
/// scale 0, so it cannot poison the others.
fn quantize_blocks<T: Copy + Default>(src: &[f32], to: fn(i32) -> T) -> (Vec<T>, Vec<f32>) {
    let mut values = vec![T::default(); src.len()];
    let scales = src
        .chunks_exact(BLOCK)
        .zip(values.chunks_exact_mut(BLOCK))
        .map(|(block, out)| quantize_block(block, out, to))
        .collect();
    (values, scales)
}

/// One block of [`quantize_blocks`]; returns its scale.
#[inline(always)]
fn quantize_block<T: Copy>(block: &[f32], out: &mut [T], to: impl Fn(i32) -> T) -> f32 {
    // The largest magnitude, in eight lanes (max is exact in any order).
    let mut lanes = [0f32; 8];
    for part in block.chunks_exact(8) {
        for (m, v) in lanes.iter_mut().zip(part) {
            *m = m.max(v.abs());
        }
    }
    let max = lanes.iter().fold(0f32, |m, v| m.max(*v));
    if max == 0.0 || !max.is_finite() {
        out.iter_mut().for_each(|o| *o = to(0));
        return 0.0;
    }
    let inv = 127.0 / max;
    for (o, v) in out.iter_mut().zip(block) {
        *o = to(integral_to_i32(
            round_half_away(v * inv).clamp(-127.0, 127.0),
        ));
    }
    max / 127.0
}

/// `v.round()` (half away from zero), exactly, for `|v| < 2^22`, in
/// operations that vectorise. Why: `f32::round` and the saturating `as i32`
/// made the activations' quantisation a scalar loop with a branch per value,
/// a third of a short text's product time once the products were VNNI.
#[inline(always)]
fn round_half_away(v: f32) -> f32 {
    let t = v.trunc();
    // `v - t` is exact: the fraction of a float below 2^22.
    if (v - t).abs() >= 0.5 {
        t + 1.0f32.copysign(v)
    } else {
        t
    }
}

/// An integral `v` with `|v| <= 2^22` as `i32`: adding 1.5 x 2^23 puts it
/// in the low mantissa bits (exactly, as it is an integer).
#[inline(always)]
fn integral_to_i32(v: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}

simd::dispatch! {
    /// Activations for the portable and AVX2 kernels: widened to `i16`.
    /// (Every build rounds the same: `round` is half away from zero.)
    fn quantize_wide(src: &[f32], values: &mut [i16], scales: &mut [f32]) {
        for ((block, out), s) in src
            .chunks_exact(BLOCK)
            .zip(values.chunks_exact_mut(BLOCK))
            .zip(scales.iter_mut())
        {
            *s = quantize_block(block, out, |q| q as i16);
        }
    }
}

simd::dispatch! {
    /// Activations for [`Form::Narrow`]: signed bytes, and each block's sum.
    fn quantize_signed(src: &[f32], values: &mut [i8], sums: &mut [i32], scales: &mut [f32]) {
        for (((block, out), s), sum) in src
            .chunks_exact(BLOCK)
            .zip(values.chunks_exact_mut(BLOCK))
            .zip(scales.iter_mut())
            .zip(sums.iter_mut())
        {
            *s = quantize_block(block, out, |q| q as i8);
            *sum = out.iter().map(|&v| v as i32).sum();
        }
    }
}

simd::dispatch! {
    /// Activations for the VNNI kernel: offset by 128 to `u8`.
    fn quantize_offset(src: &[f32], values: &mut [u8], scales: &mut [f32]) {
        for ((block, out), s) in src
            .chunks_exact(BLOCK)
            .zip(values.chunks_exact_mut(BLOCK))
            .zip(scales.iter_mut())
        {
            *s = quantize_block(block, out, |q| (q + 128) as u8);
        }
    }
}

impl Int8Matrix {
    /// Quantises a row-major `rows x cols` f32 matrix for this CPU's kernel.
    pub fn quantize(weights: &[f32], rows: usize, cols: usize) -> Int8Matrix {
        Int8Matrix::quantize_for(weights, rows, cols, Kernel::detect())
    }

    /// [`Int8Matrix::quantize`] for a given kernel (to measure or compare
    /// kernels in one process); refused if the CPU cannot run it.
    pub fn quantize_with(
        weights: &[f32],
        rows: usize,
        cols: usize,
        kernel: Kernel,
    ) -> Result<Int8Matrix, ChoiceError> {
        if !kernel.is_supported() {
            return Err(ChoiceError::Unsupported(kernel));
        }
        Ok(Int8Matrix::quantize_for(weights, rows, cols, kernel))
    }

    /// [`Int8Matrix::from_blocks`] for a given kernel; refused if the CPU
    /// cannot run it.
    pub fn from_blocks_with(
        values: Vec<i8>,
        scales: Vec<f32>,
        rows: usize,
        cols: usize,
        kernel: Kernel,
    ) -> Result<Int8Matrix, ChoiceError> {
        if !kernel.is_supported() {
            return Err(ChoiceError::Unsupported(kernel));
        }
        Ok(Int8Matrix::from_blocks_for(
            values, scales, rows, cols, kernel,
        ))
    }

    /// The kernel this matrix is multiplied with.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Callers check `kernel.is_supported()`: every product of the matrix
    /// runs `kernel` unchecked.
    fn quantize_for(weights: &[f32], rows: usize, cols: usize, kernel: Kernel) -> Int8Matrix {
        assert_eq!(weights.len(), rows * cols, "weights are not rows x cols");
        assert!(
            cols.is_multiple_of(BLOCK),
            "cols must be a multiple of {BLOCK}"
        );
        let (values, scales) = quantize_blocks(weights, |q| q as i8);
        Int8Matrix::from_blocks_for(values, scales, rows, cols, kernel)
    }

    /// A matrix whose weights are already blocks of [`BLOCK`] small signed
    /// integers with one scale each (4-bit weights widened to `i8`, say):
    /// taken as they are, so nothing is rounded a second time. `values` is
    /// row-major `rows x cols`, `scales` one per block of a row.
    pub fn from_blocks(values: Vec<i8>, scales: Vec<f32>, rows: usize, cols: usize) -> Int8Matrix {
        Int8Matrix::from_blocks_for(values, scales, rows, cols, Kernel::detect())
    }

    fn from_blocks_for(
        mut values: Vec<i8>,
        scales: Vec<f32>,
        rows: usize,
        cols: usize,
        kernel: Kernel,
    ) -> Int8Matrix {
        assert!(
            cols.is_multiple_of(BLOCK),
            "cols must be a multiple of {BLOCK}"
        );
        assert_eq!(values.len(), rows * cols, "values are not rows x cols");
        assert_eq!(scales.len(), rows * cols / BLOCK, "not one scale per block");
        let range = -NARROW_OFFSET..=NARROW_OFFSET;
        let form = if !rows.is_multiple_of(GROUP) {
            Form::Rows
        } else if values.iter().all(|&v| range.contains(&(v as i32))) {
            Form::Narrow
        } else {
            Form::Grouped
        };
        let layout = Layout::of(form, kernel, rows);
        let (values, scales) = match form {
            Form::Narrow | Form::Grouped => interleave(&values, &scales, (rows, cols), layout),
            Form::Rows => {
                if kernel.offset_rows() {
                    permute_blocks(&mut values);
                }
                (values, scales)
            }
        };
        let offset_sums = if kernel == Kernel::Amx && layout.offset == 0 {
            // Each step of a block holds four weights of each column.
            let column = |i: usize| (i / 4) % layout.group;
            values
                .chunks_exact(layout.group * BLOCK)
                .flat_map(|block| {
                    let mut sums = vec![0i32; layout.group];
                    for (i, &v) in block.iter().enumerate() {
                        sums[column(i)] += v as i32;
                    }
                    sums.into_iter().map(|s| -128 * s)
                })
                .collect()
        } else {
            Vec::new()
        };
        Int8Matrix {
            rows,
            cols,
            kernel,
            form,
            group: layout.group,
            values,
            scales,
            offset_sums,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    fn layout(&self) -> Layout {
        Layout::of(self.form, self.kernel, self.rows)
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `out = x · selfᵀ` for `x` of `m x cols` (row-major); `out` is `m x rows`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        self.matmul_with(
            &mut Scratch::default(),
            x,
            m,
            None,
            Activation::Identity,
            out,
        );
    }

    /// `out = act(x · selfᵀ + bias)`, with the activations quantised into
    /// `scratch`. The bias is added to each finished product and the
    /// activation applied in the same pass over the output, while it is in
    /// cache.
    pub fn matmul_with(
        &self,
        scratch: &mut Scratch,
        x: &[f32],
        m: usize,
        bias: Option<&[f32]>,
        act: Activation,
        out: &mut [f32],
    ) {
        assert_eq!(x.len(), m * self.cols, "input is not m x cols");
        assert_eq!(out.len(), m * self.rows, "output is not m x rows");
        if let Some(bias) = bias {
            assert_eq!(bias.len(), self.rows, "bias is not one value per row");
        }
        let xq = Int8Rows::quantize(scratch, x, m, self.cols, self);
        let out = OutPtr {
            ptr: out.as_mut_ptr(),
            ld: self.rows,
        };
        let columns = |cols: std::ops::Range<usize>| {
            // SAFETY: `out` is m x rows and borrowed mutably for this call;
            // every task below gets its own column range.
            unsafe {
                kernel::run(self, &xq, cols.clone(), out);
                finish_columns(out, m, cols, bias, act);
            }
        };
        // Columns of the output in chunks, split across the pool when worth it.
        if !split(m * self.rows * self.cols, 1 << 20) {
            columns(0..self.rows);
            return;
        }
        const CHUNK: usize = 64;
        (0..self.rows.div_ceil(CHUNK))
            .into_par_iter()
            .for_each(|c| columns(c * CHUNK..((c + 1) * CHUNK).min(self.rows)));
    }
}

/// Adds the bias to and applies `act` on columns `cols` of every output row.
///
/// # Safety
/// `out` must point to `m` rows of `out.ld` values that no other thread
/// touches in `cols`.
unsafe fn finish_columns(
    out: OutPtr,
    m: usize,
    cols: std::ops::Range<usize>,
    bias: Option<&[f32]>,
    act: Activation,
) {
    if bias.is_none() && act == Activation::Identity {
        return;
    }
    for r in 0..m {
        let row = std::slice::from_raw_parts_mut(out.ptr.add(r * out.ld + cols.start), cols.len());
        if let Some(bias) = bias {
            ops::add_in_place(row, &bias[cols.clone()]);
        }
        if act == Activation::Gelu {
            ops::gelu_in_place(row);
        }
    }
}

impl<'a> Int8Rows<'a> {
    /// `x` (`m x k`) in the form `w` multiplies.
    fn quantize(scratch: &'a mut Scratch, x: &[f32], m: usize, k: usize, w: &Int8Matrix) -> Self {
        debug_assert_eq!(x.len(), m * k);
        let Scratch {
            wide,
            offset,
            signed,
            sums,
            scales,
        } = scratch;
        scales.clear();
        scales.resize(x.len() / BLOCK, 0.0);
        if w.layout().signed_activations() {
            signed.clear();
            signed.resize(x.len(), 0);
            sums.clear();
            sums.resize(x.len() / BLOCK, 0);
            quantize_signed(x, signed, sums, scales);
            let values = RowValues::Signed {
                values: signed,
                sums,
            };
            return Int8Rows { k, values, scales };
        }
        // Only the row form's VNNI kernels read offset bytes; the portable
        // and AVX2 kernels of the other forms read values widened to 16 bits.
        let values = if w.form == Form::Rows && w.kernel.offset_rows() {
            offset.clear();
            offset.resize(x.len(), 0);
            quantize_offset(x, offset, scales);
            permute_blocks(offset);
            RowValues::Offset(offset)
        } else {
            wide.clear();
            wide.resize(x.len(), 0);
            quantize_wide(x, wide, scales);
            RowValues::Wide(wide)
        };
        Int8Rows { k, values, scales }
    }

    fn rows(&self) -> usize {
        let len = match &self.values {
            RowValues::Wide(v) => v.len(),
            RowValues::Offset(v) => v.len(),
            RowValues::Signed { values, .. } => values.len(),
        };
        len / self.k
    }
}

/// The AMX kernel against the portable one on small random products of
/// both weight forms, row counts below, at and above a tile (16), an odd
/// number of blocks, and three groups of columns: whether every bit is the
/// same. Run once, before AMX is chosen (see [`amx::works`]): a kernel that
/// gave other sums would silently change every embedding.
fn amx_self_check() -> bool {
    let (n, k) = (48, 96);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    let eight: Vec<i8> = (0..n * k).map(|_| next() as u8 as i8).collect();
    let four: Vec<i8> = (0..n * k).map(|_| (next() % 17) as i8 - 8).collect();
    let scales: Vec<f32> = (0..n * k / BLOCK)
        .map(|_| (next() % 1000 + 1) as f32 / 997.0)
        .collect();
    let mut same = true;
    for values in [eight, four] {
        let amx = Int8Matrix::from_blocks_for(values.clone(), scales.clone(), n, k, Kernel::Amx);
        let portable = Int8Matrix::from_blocks_for(values, scales.clone(), n, k, Kernel::Portable);
        for m in [1, 5, 16, 21] {
            // Activations as quantising gives them, built here and not
            // quantised: quantising asks which kernel the process uses,
            // which is what this check is deciding.
            let signed: Vec<i8> = (0..m * k)
                .map(|_| ((next() % 255) as i32 - 127) as i8)
                .collect();
            let wide: Vec<i16> = signed.iter().map(|&v| v as i16).collect();
            let sums: Vec<i32> = signed
                .chunks_exact(BLOCK)
                .map(|b| b.iter().map(|&v| v as i32).sum())
                .collect();
            let x_scales: Vec<f32> = (0..m * k / BLOCK)
                .map(|_| (next() % 1000 + 1) as f32 / 1009.0)
                .collect();
            let product = |w: &Int8Matrix| {
                let values = if w.layout().signed_activations() {
                    RowValues::Signed {
                        values: &signed,
                        sums: &sums,
                    }
                } else {
                    RowValues::Wide(&wide)
                };
                let x = Int8Rows {
                    k,
                    values,
                    scales: &x_scales,
                };
                let mut out = vec![0f32; m * n];
                let ptr = OutPtr {
                    ptr: out.as_mut_ptr(),
                    ld: n,
                };
                // SAFETY: `out` is m x n and only this call writes it. The
                // AMX matrix runs the AMX kernel unchecked: this function
                // runs once the CPU, the OS and Linux's permission said yes.
                unsafe { kernel::run(w, &x, 0..n, ptr) };
                out
            };
            let (a, p) = (product(&amx), product(&portable));
            same &= a.iter().zip(&p).all(|(a, p)| a.to_bits() == p.to_bits());
        }
    }
    same
}

mod kernel {
    use super::{Form, Int8Matrix, Int8Rows, Kernel, OutPtr, RowValues, BLOCK, GROUP};
    use std::ops::Range;

    /// Writes, for every activation row `r` and weight row `n` in `cols`,
    /// their product to `out[r * out.ld + n]`.
    ///
    /// # Safety
    /// `out` must point to `x.rows()` rows of `out.ld >= cols.end` values
    /// that no other thread touches in `cols`.
    pub(super) unsafe fn run(w: &Int8Matrix, x: &Int8Rows, cols: Range<usize>, out: OutPtr) {
        // SAFETY (every x86 call below): a matrix is only built for a
        // kernel the CPU runs (`Kernel::is_supported`, checked by
        // `choose_kernel` and the `*_with` constructors), and each function
        // is compiled for no more than that kernel's features.
        match (w.form, &x.values) {
            (Form::Narrow | Form::Grouped, &RowValues::Signed { values, sums }) => {
                let x = Narrow {
                    values,
                    sums,
                    scales: x.scales,
                    k: x.k,
                };
                match (w.kernel, w.form) {
                    #[cfg(target_arch = "x86_64")]
                    (Kernel::Amx, _) if w.group == super::WIDE_GROUP => unsafe {
                        x86::amx(w, &x, cols, out)
                    },
                    #[cfg(target_arch = "x86_64")]
                    (Kernel::Amx, _) => unsafe { x86::dot_avx512_256(w, &x, cols, out) },
                    #[cfg(target_arch = "x86_64")]
                    (Kernel::Avx512Vnni, _) if w.group == super::WIDE_GROUP => unsafe {
                        x86::dot_avx512(w, &x, cols, out)
                    },
                    #[cfg(target_arch = "x86_64")]
                    (Kernel::Avx512Vnni, _) => unsafe { x86::dot_avx512_256(w, &x, cols, out) },
                    #[cfg(target_arch = "x86_64")]
                    (Kernel::AvxVnni, _) => unsafe { x86::dot_avxvnni(w, &x, cols, out) },
                    #[cfg(target_arch = "x86_64")]
                    (Kernel::Avx2, Form::Narrow) => unsafe { x86::narrow_avx2(w, &x, cols, out) },
                    (Kernel::Portable, Form::Narrow) => portable_narrow(w, &x, cols, out),
                    _ => unreachable!("signed activations for another kernel"),
                }
            }
            (Form::Grouped, RowValues::Wide(xv)) => match w.kernel {
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx2 => unsafe { x86::grouped_avx2(w, xv, x, cols, out) },
                Kernel::Portable => portable_grouped(w, xv, x, cols, out),
                _ => unreachable!("wide activations for a VNNI kernel"),
            },
            (Form::Rows, values) => match (w.kernel, values) {
                #[cfg(target_arch = "x86_64")]
                (Kernel::Avx2, RowValues::Wide(xv)) => unsafe { x86::avx2(w, xv, x, cols, out) },
                #[cfg(target_arch = "x86_64")]
                (Kernel::Avx512Vnni | Kernel::Amx, RowValues::Offset(xv)) => unsafe {
                    x86::vnni(w, xv, x, cols, out)
                },
                #[cfg(target_arch = "x86_64")]
                (Kernel::AvxVnni, RowValues::Offset(xv)) => unsafe {
                    x86::avxvnni(w, xv, x, cols, out)
                },
                (Kernel::Portable, RowValues::Wide(xv)) => portable(w, xv, x, cols, out),
                _ => unreachable!("activations are quantised for the matrix's kernel"),
            },
            _ => unreachable!("activations are quantised for the matrix's form"),
        }
    }

    /// The AVX2 kernel's arithmetic in plain Rust, lane for lane, so that
    /// it rounds identically: eight lane sums per block, each scaled with a
    /// fused multiply-add, then the same pairwise horizontal sum.
    unsafe fn portable(w: &Int8Matrix, xv: &[i16], x: &Int8Rows, cols: Range<usize>, out: OutPtr) {
        let k = x.k;
        let blocks = k / BLOCK;
        for n in cols {
            let wrow = &w.values[n * k..(n + 1) * k];
            let wscale = &w.scales[n * blocks..(n + 1) * blocks];
            for r in 0..x.rows() {
                let xrow = &xv[r * k..(r + 1) * k];
                let mut acc = [0f32; 8];
                for (b, &ws) in wscale.iter().enumerate() {
                    let (wb, xb) = (&wrow[b * BLOCK..][..BLOCK], &xrow[b * BLOCK..][..BLOCK]);
                    let p = |i: usize| wb[i] as i32 * xb[i] as i32;
                    let scale = ws * x.scales[r * blocks + b];
                    for (lane, a) in acc.iter_mut().enumerate() {
                        let (e, h) = (2 * lane, 16 + 2 * lane);
                        let sum = (p(e) + p(e + 1)) + (p(h) + p(h + 1));
                        *a = (sum as f32).mul_add(scale, *a);
                    }
                }
                *out.ptr.add(r * out.ld + n) = lane_sum(&acc);
            }
        }
    }

    /// Activations quantised for a [`Form::Narrow`] matrix.
    pub(super) struct Narrow<'a> {
        values: &'a [i8],
        sums: &'a [i32],
        scales: &'a [f32],
        k: usize,
    }

    impl Narrow<'_> {
        fn rows(&self) -> usize {
            self.values.len() / self.k
        }
    }

    /// The arithmetic of the narrow and grouped AVX2 kernels in plain Rust:
    /// per output column and block an exact integer sum (`block_sum` of the
    /// activation row, the block, the column group's block of weights and
    /// the column within it), scaled with one fused multiply-add.
    unsafe fn portable_in_groups(
        w: &Int8Matrix,
        (m, k): (usize, usize),
        x_scales: &[f32],
        cols: Range<usize>,
        out: OutPtr,
        block_sum: impl Fn(usize, usize, &[i8], usize) -> i32,
    ) {
        let blocks = k / BLOCK;
        for n in cols {
            let (g, c) = (n / GROUP, n % GROUP);
            for r in 0..m {
                let mut acc = 0f32;
                for b in 0..blocks {
                    let group_block = g * blocks + b;
                    let wb = &w.values[group_block * GROUP * BLOCK..][..GROUP * BLOCK];
                    let sum = block_sum(r, b, wb, c);
                    let scale = w.scales[group_block * GROUP + c] * x_scales[r * blocks + b];
                    acc = (sum as f32).mul_add(scale, acc);
                }
                *out.ptr.add(r * out.ld + n) = acc;
            }
        }
    }

    /// The narrow AVX2 kernel's arithmetic: offset weights (read unsigned)
    /// by signed activations, less the offset times the activations' sum.
    unsafe fn portable_narrow(w: &Int8Matrix, x: &Narrow, cols: Range<usize>, out: OutPtr) {
        let (k, blocks) = (x.k, x.k / BLOCK);
        let shape = (x.rows(), k);
        portable_in_groups(w, shape, x.scales, cols, out, |r, b, wb, c| {
            let xb = &x.values[r * k + b * BLOCK..][..BLOCK];
            let offset_sum: i32 = (0..BLOCK)
                .map(|i| (wb[(i / 4) * GROUP * 4 + c * 4 + i % 4] as u8) as i32 * xb[i] as i32)
                .sum();
            offset_sum - super::NARROW_OFFSET * x.sums[r * blocks + b]
        });
    }

    /// The grouped AVX2 kernel's arithmetic.
    unsafe fn portable_grouped(
        w: &Int8Matrix,
        xv: &[i16],
        x: &Int8Rows,
        cols: Range<usize>,
        out: OutPtr,
    ) {
        let k = x.k;
        portable_in_groups(w, (x.rows(), k), x.scales, cols, out, |r, b, wb, c| {
            let xb = &xv[r * k + b * BLOCK..][..BLOCK];
            (0..BLOCK)
                .map(|i| wb[(i / 2) * GROUP * 2 + c * 2 + i % 2] as i32 * xb[i] as i32)
                .sum()
        });
    }

    /// The horizontal sum in the order the SIMD kernels do it.
    fn lane_sum(acc: &[f32; 8]) -> f32 {
        let pair: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
        (pair[0] + pair[2]) + (pair[1] + pair[3])
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use super::super::{Int8Matrix, Int8Rows, OutPtr, BLOCK, GROUP, WIDE_GROUP};
        use super::Narrow;
        use std::arch::x86_64::*;
        use std::ops::Range;

        /// Activation rows handled together, so each weight block is
        /// loaded once and used four times.
        const ROWS: usize = 4;
        /// Activation rows per cache tile: 32 x 1536 16-bit values = 96 KB.
        const TILE_ROWS: usize = 32;

        /// Where one group of activation rows is read: its values (the
        /// group's first row), its block scales, and the row length.
        #[derive(Clone, Copy)]
        struct Rows<T> {
            values: *const T,
            scales: *const f32,
            k: usize,
            blocks: usize,
        }

        impl<T> Rows<T> {
            /// Row `i` of the group, block `b`.
            #[inline(always)]
            unsafe fn block(self, i: usize, b: usize) -> *const T {
                self.values.add(i * self.k + b * BLOCK)
            }

            #[inline(always)]
            unsafe fn scale(self, i: usize, b: usize) -> f32 {
                *self.scales.add(i * self.blocks + b)
            }
        }

        /// Visits every (output column, group of up to `ROWS` activation
        /// rows), tiled so a tile of rows stays in cache while the chunk's
        /// weight rows pass over it, and writes each group's sums. `group`
        /// gets the column's weight row and block scales, the group's rows
        /// and their number, and returns the group's lane sums.
        ///
        /// Why the number of rows is a constant of the kernel's inner
        /// function (`R` below) and not a loop bound: with a bound known only
        /// at run time the compiler kept a branch and a bounds check per row
        /// and block and reloaded the row pointers from the stack, about as
        /// many instructions as the multiply-adds themselves.
        #[inline(always)]
        unsafe fn for_each_group<T>(
            w: &Int8Matrix,
            xv: &[T],
            x: &Int8Rows,
            cols: Range<usize>,
            out: OutPtr,
            mut group: impl FnMut(*const i8, &[f32], Rows<T>, usize) -> [__m256; ROWS],
        ) {
            let (k, m) = (x.k, x.rows());
            let blocks = k / BLOCK;
            assert!(xv.len() >= m * k && x.scales.len() >= m * blocks);
            for tile in (0..m).step_by(TILE_ROWS) {
                let tile_end = (tile + TILE_ROWS).min(m);
                for n in cols.clone() {
                    let wrow = w.values[n * k..(n + 1) * k].as_ptr();
                    let wscale = &w.scales[n * blocks..(n + 1) * blocks];
                    let mut r = tile;
                    while r < tile_end {
                        let rows = (tile_end - r).min(ROWS);
                        let group_rows = Rows {
                            values: xv.as_ptr().add(r * k),
                            scales: x.scales.as_ptr().add(r * blocks),
                            k,
                            blocks,
                        };
                        let acc = group(wrow, wscale, group_rows, rows);
                        for (i, a) in acc.iter().enumerate().take(rows) {
                            *out.ptr.add((r + i) * out.ld + n) = horizontal_sum(*a);
                        }
                        r += rows;
                    }
                }
            }
        }

        #[target_feature(enable = "avx2,fma")]
        pub(super) unsafe fn avx2(
            w: &Int8Matrix,
            xv: &[i16],
            x: &Int8Rows,
            cols: Range<usize>,
            out: OutPtr,
        ) {
            for_each_group(w, xv, x, cols, out, |wrow, wscale, rows, n| match n {
                4 => avx2_rows::<4>(wrow, wscale, rows),
                3 => avx2_rows::<3>(wrow, wscale, rows),
                2 => avx2_rows::<2>(wrow, wscale, rows),
                _ => avx2_rows::<1>(wrow, wscale, rows),
            });
        }

        /// The lane sums of `R` activation rows against one weight row.
        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn avx2_rows<const R: usize>(
            wrow: *const i8,
            wscale: &[f32],
            rows: Rows<i16>,
        ) -> [__m256; ROWS] {
            let mut acc = [_mm256_setzero_ps(); ROWS];
            for (b, &ws) in wscale.iter().enumerate() {
                // SAFETY: b * BLOCK + 32 <= k bytes of this weight row.
                let raw = _mm256_loadu_si256(wrow.add(b * BLOCK) as *const __m256i);
                let lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(raw));
                let hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(raw));
                for (i, a) in acc.iter_mut().enumerate().take(R) {
                    // SAFETY: the group has R rows of k values and k / BLOCK scales.
                    let xs = rows.block(i, b);
                    let xlo = _mm256_loadu_si256(xs as *const __m256i);
                    let xhi = _mm256_loadu_si256(xs.add(16) as *const __m256i);
                    let sum =
                        _mm256_add_epi32(_mm256_madd_epi16(lo, xlo), _mm256_madd_epi16(hi, xhi));
                    let scale = _mm256_set1_ps(ws * rows.scale(i, b));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *a);
                }
            }
            acc
        }

        /// The row-form kernel on 8-bit dot products, in either encoding
        /// of `vpdpbusd` (`$dpbusd`): AVX-512 VNNI's on 256-bit registers
        /// (EVEX) or AVX-VNNI's (VEX). Layout: weights row-major, each
        /// block in [`super::super::VNNI_ORDER`]; activations offset by 128
        /// to `u8`, in the same order.
        macro_rules! rows_vnni {
            ($name:ident, $rows:ident, $features:literal, $dpbusd:ident) => {
                #[target_feature(enable = $features)]
                pub(super) unsafe fn $name(
                    w: &Int8Matrix,
                    xv: &[u8],
                    x: &Int8Rows,
                    cols: Range<usize>,
                    out: OutPtr,
                ) {
                    for_each_group(w, xv, x, cols, out, |wrow, wscale, rows, n| match n {
                        4 => $rows::<4>(wrow, wscale, rows),
                        3 => $rows::<3>(wrow, wscale, rows),
                        2 => $rows::<2>(wrow, wscale, rows),
                        _ => $rows::<1>(wrow, wscale, rows),
                    });
                }

                /// [`avx2_rows`] with 8-bit dot products.
                #[target_feature(enable = $features)]
                #[inline]
                unsafe fn $rows<const R: usize>(
                    wrow: *const i8,
                    wscale: &[f32],
                    rows: Rows<u8>,
                ) -> [__m256; ROWS] {
                    let offset = _mm256_set1_epi8(-128i8); // the byte 0x80: 128 unsigned
                    let zero = _mm256_setzero_si256();
                    let mut acc = [_mm256_setzero_ps(); ROWS];
                    for (b, &ws) in wscale.iter().enumerate() {
                        // SAFETY: b * BLOCK + 32 <= k bytes of this weight row.
                        let wv = _mm256_loadu_si256(wrow.add(b * BLOCK) as *const __m256i);
                        // The activations carry +128: start each lane at -128 x its weights.
                        let start = _mm256_sub_epi32(zero, $dpbusd(zero, offset, wv));
                        for (i, a) in acc.iter_mut().enumerate().take(R) {
                            // SAFETY: the group has R rows of k bytes and k / BLOCK scales.
                            let xs = rows.block(i, b);
                            let sum = $dpbusd(start, _mm256_loadu_si256(xs as *const __m256i), wv);
                            let scale = _mm256_set1_ps(ws * rows.scale(i, b));
                            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *a);
                        }
                    }
                    acc
                }
            };
        }

        rows_vnni!(
            vnni,
            vnni_rows,
            "avx2,fma,avx512f,avx512vnni,avx512vl",
            _mm256_dpbusd_epi32
        );
        rows_vnni!(
            avxvnni,
            avxvnni_rows,
            "avx2,fma,avxvnni",
            _mm256_dpbusd_avx_epi32
        );

        /// Visits every (group of eight output columns in `cols`, group of
        /// up to `ROWS` of the `m` activation rows), a tile of rows at a time
        /// so that they stay in cache while the column groups pass, and
        /// stores the eight sums of each row. `group` gets the column
        /// group's weights and scales, its first row and number of rows.
        #[inline(always)]
        unsafe fn for_each_column_group(
            w: &Int8Matrix,
            m: usize,
            k: usize,
            cols: Range<usize>,
            out: OutPtr,
            mut group: impl FnMut(*const i8, *const f32, usize, usize) -> [__m256; ROWS],
        ) {
            let blocks = k / BLOCK;
            assert!(cols.start.is_multiple_of(GROUP) && cols.end.is_multiple_of(GROUP));
            assert!(w.values.len() >= cols.end * k && w.scales.len() >= cols.end * blocks);
            for tile in (0..m).step_by(TILE_ROWS) {
                let tile_end = (tile + TILE_ROWS).min(m);
                for g in cols.start / GROUP..cols.end / GROUP {
                    let weights = w.values.as_ptr().add(g * blocks * GROUP * BLOCK);
                    let wscales = w.scales.as_ptr().add(g * blocks * GROUP);
                    let mut r = tile;
                    while r < tile_end {
                        let rows = (tile_end - r).min(ROWS);
                        let acc = group(weights, wscales, r, rows);
                        for (i, a) in acc.iter().enumerate().take(rows) {
                            _mm256_storeu_ps(out.ptr.add((r + i) * out.ld + g * GROUP), *a);
                        }
                        r += rows;
                    }
                }
            }
        }

        /// [`super::portable_narrow`] on AVX2.
        #[target_feature(enable = "avx2,fma")]
        pub(super) unsafe fn narrow_avx2(
            w: &Int8Matrix,
            x: &Narrow,
            cols: Range<usize>,
            out: OutPtr,
        ) {
            let (k, m) = (x.k, x.rows());
            let blocks = k / BLOCK;
            assert!(x.sums.len() >= m * blocks && x.scales.len() >= m * blocks);
            for_each_column_group(w, m, k, cols, out, |weights, wscales, r, rows| {
                let group = NarrowRows {
                    values: x.values.as_ptr().add(r * k),
                    sums: x.sums.as_ptr().add(r * blocks),
                    scales: x.scales.as_ptr().add(r * blocks),
                    k,
                    blocks,
                };
                match rows {
                    4 => narrow_rows::<4>(weights, wscales, group),
                    3 => narrow_rows::<3>(weights, wscales, group),
                    2 => narrow_rows::<2>(weights, wscales, group),
                    _ => narrow_rows::<1>(weights, wscales, group),
                }
            });
        }

        /// [`super::portable_grouped`] on AVX2.
        #[target_feature(enable = "avx2,fma")]
        pub(super) unsafe fn grouped_avx2(
            w: &Int8Matrix,
            xv: &[i16],
            x: &Int8Rows,
            cols: Range<usize>,
            out: OutPtr,
        ) {
            let (k, m) = (x.k, x.rows());
            let blocks = k / BLOCK;
            assert!(xv.len() >= m * k && x.scales.len() >= m * blocks);
            for_each_column_group(w, m, k, cols, out, |weights, wscales, r, rows| {
                let group = Rows {
                    values: xv.as_ptr().add(r * k),
                    scales: x.scales.as_ptr().add(r * blocks),
                    k,
                    blocks,
                };
                match rows {
                    4 => grouped_rows::<4>(weights, wscales, group),
                    3 => grouped_rows::<3>(weights, wscales, group),
                    2 => grouped_rows::<2>(weights, wscales, group),
                    _ => grouped_rows::<1>(weights, wscales, group),
                }
            });
        }

        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn grouped_rows<const R: usize>(
            weights: *const i8,
            wscales: *const f32,
            rows: Rows<i16>,
        ) -> [__m256; ROWS] {
            let mut acc = [_mm256_setzero_ps(); ROWS];
            for b in 0..rows.blocks {
                let mut sums = [_mm256_setzero_si256(); ROWS];
                for step in 0..BLOCK / 2 {
                    let wp = weights.add((b * BLOCK / 2 + step) * GROUP * 2);
                    let wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp as *const __m128i));
                    for (i, s) in sums.iter_mut().enumerate().take(R) {
                        let at = rows.block(i, b).add(2 * step);
                        let xv = _mm256_set1_epi32((at as *const i32).read_unaligned());
                        *s = _mm256_add_epi32(*s, _mm256_madd_epi16(wv, xv));
                    }
                }
                let ws = _mm256_loadu_ps(wscales.add(b * GROUP));
                for (i, a) in acc.iter_mut().enumerate().take(R) {
                    let scale = _mm256_mul_ps(ws, _mm256_set1_ps(rows.scale(i, b)));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[i]), scale, *a);
                }
            }
            acc
        }

        /// Where a group of activation rows of a narrow product is read.
        #[derive(Clone, Copy)]
        struct NarrowRows {
            values: *const i8,
            sums: *const i32,
            scales: *const f32,
            k: usize,
            blocks: usize,
        }

        /// The eight columns' sums of `R` activation rows.
        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn narrow_rows<const R: usize>(
            weights: *const i8,
            wscales: *const f32,
            rows: NarrowRows,
        ) -> [__m256; ROWS] {
            let ones = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); ROWS];
            for b in 0..rows.blocks {
                let mut sums = [_mm256_setzero_si256(); ROWS];
                for q in 0..BLOCK / 4 {
                    // SAFETY: the group's block b holds 8 quads of 32 bytes.
                    let wq = weights.add((b * BLOCK / 4 + q) * GROUP * 4);
                    let wv = _mm256_loadu_si256(wq as *const __m256i);
                    for (i, s) in sums.iter_mut().enumerate().take(R) {
                        // SAFETY: row i has k values; b * BLOCK + 4q + 4 <= k.
                        let at = rows.values.add(i * rows.k + b * BLOCK + 4 * q);
                        let xv = _mm256_set1_epi32((at as *const i32).read_unaligned());
                        // Pairs of offset weight (0..=16) x activation: at
                        // most 4,064, and 16 of them per 16-bit lane over
                        // the block at most 32,512: no saturation or wrap.
                        *s = _mm256_add_epi16(*s, _mm256_maddubs_epi16(wv, xv));
                    }
                }
                let ws = _mm256_loadu_ps(wscales.add(b * GROUP));
                for (i, a) in acc.iter_mut().enumerate().take(R) {
                    let at = i * rows.blocks + b;
                    let offset =
                        _mm256_set1_epi32(super::super::NARROW_OFFSET * *rows.sums.add(at));
                    let sum = _mm256_sub_epi32(_mm256_madd_epi16(sums[i], ones), offset);
                    let scale = _mm256_mul_ps(ws, _mm256_set1_ps(*rows.scales.add(at)));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *a);
                }
            }
            acc
        }

        /// Visits every (up to `C` adjacent groups of `G` output columns in
        /// `cols`, group of up to `ROWS` of the `m` activation rows), a tile
        /// of rows at a time so that they stay in cache while the column
        /// groups pass. `group` gets the first column group's weights and
        /// scales (the next group's follow at [`group_stride`]), its first
        /// activation row, its number of rows, its first output column and
        /// its number of column groups, and stores its results itself.
        #[inline(always)]
        unsafe fn for_each_group_of<const G: usize, const C: usize>(
            w: &Int8Matrix,
            m: usize,
            k: usize,
            cols: Range<usize>,
            mut group: impl FnMut(*const i8, *const f32, usize, usize, usize, usize),
        ) {
            let blocks = k / BLOCK;
            assert_eq!(w.group, G, "the matrix is interleaved for this kernel");
            assert!(cols.start.is_multiple_of(G) && cols.end.is_multiple_of(G));
            assert!(w.values.len() >= cols.end * k && w.scales.len() >= cols.end * blocks);
            let groups = cols.start / G..cols.end / G;
            for tile in (0..m).step_by(TILE_ROWS) {
                let tile_end = (tile + TILE_ROWS).min(m);
                for g in groups.clone().step_by(C) {
                    let together = (groups.end - g).min(C);
                    let weights = w.values.as_ptr().add(g * blocks * G * BLOCK);
                    let wscales = w.scales.as_ptr().add(g * blocks * G);
                    let mut r = tile;
                    while r < tile_end {
                        let rows = (tile_end - r).min(ROWS);
                        group(weights, wscales, r, rows, g * G, together);
                        r += rows;
                    }
                }
            }
        }

        /// From one column group's weights (and scales) to the next's, for
        /// a shared dimension of `blocks` blocks.
        #[inline(always)]
        fn group_stride<const G: usize>(blocks: usize) -> (usize, usize) {
            (blocks * G * BLOCK, blocks * G)
        }

        /// The activation rows of a product on signed bytes, from row `r`.
        ///
        /// # Safety
        /// `r` must be below `x.rows()`.
        #[inline(always)]
        unsafe fn narrow_rows_from(x: &Narrow, r: usize) -> NarrowRows {
            let (k, blocks) = (x.k, x.k / BLOCK);
            NarrowRows {
                values: x.values.as_ptr().add(r * k),
                sums: x.sums.as_ptr().add(r * blocks),
                scales: x.scales.as_ptr().add(r * blocks),
                k,
                blocks,
            }
        }

        /// Checks that `x` holds `x.rows()` whole rows, for the kernels'
        /// unchecked reads.
        fn check_narrow(x: &Narrow) {
            let (m, blocks) = (x.rows(), x.k / BLOCK);
            assert!(x.values.len() >= m * x.k);
            assert!(x.sums.len() >= m * blocks && x.scales.len() >= m * blocks);
        }

        /// [`Form::Narrow`] and [`Form::Grouped`] on AVX-512 VNNI, sixteen
        /// columns at a time.
        ///
        /// Layout ([`super::super::Layout::of`]): per group of 16 output
        /// columns and block of 32, eight 64-byte steps; step `q` holds for
        /// each column in turn its weights `4q..4q+4` of the block plus the
        /// form's offset, as unsigned bytes. Activations: signed bytes,
        /// row-major, with each block's sum. Lane `c` of `vpdpbusd` adds the
        /// column's four products with the broadcast activations `4q..4q+4`;
        /// the lane starts at `-offset x` the activations' block sum, so a
        /// block ends at the exact integer sum of the portable kernel.
        #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
        pub(super) unsafe fn dot_avx512(
            w: &Int8Matrix,
            x: &Narrow,
            cols: Range<usize>,
            out: OutPtr,
        ) {
            check_narrow(x);
            let offset = w.layout().offset;
            for_each_group_of::<WIDE_GROUP, 2>(
                w,
                x.rows(),
                x.k,
                cols,
                |weights, wscales, r, n, col, groups| {
                    let rows = narrow_rows_from(x, r);
                    let at = (weights, wscales);
                    if groups == 2 {
                        let acc = match n {
                            4 => dot512_rows::<4, 2>(at, rows, offset),
                            3 => dot512_rows::<3, 2>(at, rows, offset),
                            2 => dot512_rows::<2, 2>(at, rows, offset),
                            _ => dot512_rows::<1, 2>(at, rows, offset),
                        };
                        store512(&acc, n, out, r, col);
                    } else {
                        let acc = match n {
                            4 => dot512_rows::<4, 1>(at, rows, offset),
                            3 => dot512_rows::<3, 1>(at, rows, offset),
                            2 => dot512_rows::<2, 1>(at, rows, offset),
                            _ => dot512_rows::<1, 1>(at, rows, offset),
                        };
                        store512(&acc, n, out, r, col);
                    }
                },
            );
        }

        /// Stores `n` rows of `C` groups of sixteen sums from row `r` and
        /// column `col`.
        #[target_feature(enable = "avx512f")]
        #[inline]
        unsafe fn store512<const C: usize>(
            acc: &[[__m512; C]; ROWS],
            n: usize,
            out: OutPtr,
            r: usize,
            col: usize,
        ) {
            for (i, row) in acc.iter().enumerate().take(n) {
                for (c, a) in row.iter().enumerate() {
                    let at = out.ptr.add((r + i) * out.ld + col + c * WIDE_GROUP);
                    _mm512_storeu_ps(at, *a);
                }
            }
        }

        /// The sums of `R` activation rows for `C` adjacent groups of
        /// sixteen columns: each weight vector serves `R` rows, each
        /// broadcast activation `C` groups, so there are fewer loads per
        /// dot product than with one group.
        #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn dot512_rows<const R: usize, const C: usize>(
            (weights, wscales): (*const i8, *const f32),
            rows: NarrowRows,
            offset: i32,
        ) -> [[__m512; C]; ROWS] {
            let (wstride, sstride) = group_stride::<WIDE_GROUP>(rows.blocks);
            let mut acc = [[_mm512_setzero_ps(); C]; ROWS];
            for b in 0..rows.blocks {
                let mut sums = [[_mm512_setzero_si512(); C]; ROWS];
                for (i, s) in sums.iter_mut().enumerate().take(R) {
                    let start = _mm512_set1_epi32(-offset * *rows.sums.add(i * rows.blocks + b));
                    *s = [start; C];
                }
                for q in 0..BLOCK / 4 {
                    // SAFETY: each group's block b holds 8 steps of 64 bytes.
                    let wq = weights.add((b * BLOCK / 4 + q) * WIDE_GROUP * 4);
                    let wv: [__m512i; C] = std::array::from_fn(|c| {
                        _mm512_loadu_si512(wq.add(c * wstride) as *const __m512i)
                    });
                    for (i, s) in sums.iter_mut().enumerate().take(R) {
                        // SAFETY: row i has k values; b * BLOCK + 4q + 4 <= k.
                        let at = rows.values.add(i * rows.k + b * BLOCK + 4 * q);
                        let xv = _mm512_set1_epi32((at as *const i32).read_unaligned());
                        for (sc, wc) in s.iter_mut().zip(&wv) {
                            *sc = _mm512_dpbusd_epi32(*sc, *wc, xv);
                        }
                    }
                }
                let ws: [__m512; C] = std::array::from_fn(|c| {
                    _mm512_loadu_ps(wscales.add(c * sstride + b * WIDE_GROUP))
                });
                for (i, a) in acc.iter_mut().enumerate().take(R) {
                    let xs = _mm512_set1_ps(*rows.scales.add(i * rows.blocks + b));
                    for c in 0..C {
                        let scale = _mm512_mul_ps(ws[c], xs);
                        a[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[i][c]), scale, a[c]);
                    }
                }
            }
            acc
        }

        /// [`Form::Narrow`] and [`Form::Grouped`] on AMX tiles, sixteen
        /// activation rows by sixteen columns by one block per `tdpbssd`.
        ///
        /// Layout ([`super::super::Layout::of`]): as [`dot_avx512`]'s with no
        /// offset: per group of 16 output columns and block of 32, eight
        /// 64-byte steps; step `q` holds for each column in turn its weights
        /// `4q..4q+4` of the block as signed bytes, which is `tdpbssd`'s
        /// second tile as it lies in memory. Activations: signed bytes,
        /// row-major, `k` apart, read as a tile of 16 rows by one block.
        ///
        /// Why one block (K = 32) per tile product and not the 64 bytes a
        /// tile row holds: each block has its own pair of scales, and the
        /// portable kernel scales each block's exact sum on its own; the
        /// sums of two blocks added together could not be split again. The
        /// tile's sums go to memory and are scaled with AVX-512 exactly as
        /// [`dot512_rows`] scales its registers, so the bits are the same.
        #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
        pub(super) unsafe fn amx(w: &Int8Matrix, x: &Narrow, cols: Range<usize>, out: OutPtr) {
            check_narrow(x);
            crate::amx::configure_thread();
            let (m, k) = (x.rows(), x.k);
            let blocks = k / BLOCK;
            assert_eq!(w.group, WIDE_GROUP, "the matrix is interleaved for AMX");
            assert!(cols.start.is_multiple_of(WIDE_GROUP) && cols.end.is_multiple_of(WIDE_GROUP));
            assert!(w.values.len() >= cols.end * k && w.scales.len() >= cols.end * blocks);
            let (wstride, sstride) = group_stride::<WIDE_GROUP>(blocks);
            assert_eq!(w.offset_sums.len(), w.scales.len());
            // A last tile of at least `TILE_AT_LEAST` rows is read from a
            // copy padded with zeros (a tile always loads 16 rows); fewer
            // rows go to AVX-512 VNNI, which costs per row.
            let mut padded: (Vec<i8>, Vec<f32>) = (Vec::new(), Vec::new());
            for tile in (0..m).step_by(TILE) {
                let valid = (m - tile).min(TILE);
                if valid < TILE_AT_LEAST {
                    signed_avx512(w, x, tile, cols.clone(), out);
                    break;
                }
                let (values, scales) = if valid == TILE {
                    (
                        x.values.as_ptr().add(tile * k),
                        x.scales.as_ptr().add(tile * blocks),
                    )
                } else {
                    padded.0.resize(TILE * k, 0);
                    padded.0[..valid * k].copy_from_slice(&x.values[tile * k..m * k]);
                    padded.1.resize(TILE * blocks, 0.0);
                    padded.1[..valid * blocks]
                        .copy_from_slice(&x.scales[tile * blocks..m * blocks]);
                    (padded.0.as_ptr(), padded.1.as_ptr())
                };
                let rows = TileRows {
                    values,
                    scales,
                    k,
                    blocks,
                };
                for g in cols.start / WIDE_GROUP..cols.end / WIDE_GROUP {
                    let at = (
                        w.values.as_ptr().add(g * wstride),
                        w.scales.as_ptr().add(g * sstride),
                    );
                    let acc = match valid {
                        16 => amx_rows::<16>(at, rows),
                        _ => amx_rows::<12>(at, rows),
                    };
                    for (i, a) in acc.iter().enumerate().take(valid) {
                        _mm512_storeu_ps(out.ptr.add((tile + i) * out.ld + g * WIDE_GROUP), *a);
                    }
                }
            }
        }

        /// Rows below which a tile product costs more than AVX-512 VNNI's
        /// per-row dot products (on a 2-core Xeon, KVM: 4 rows took 26 µs
        /// on tiles against 14 µs for a 1536 x 384 product, 8 rows 36 against
        /// 28, 16 rows 47 against 56).
        const TILE_AT_LEAST: usize = 12;

        /// Rows `from..` of an AMX-layout product on AVX-512 VNNI: the
        /// weights are signed, so the activations are the unsigned operand
        /// (offset by 128, a flip of each byte's top bit) and each block's
        /// sums start at the matrix's `offset_sums`. Same exact integers,
        /// same scaling as [`dot512_rows`]: the same bits.
        #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
        unsafe fn signed_avx512(
            w: &Int8Matrix,
            x: &Narrow,
            from: usize,
            cols: Range<usize>,
            out: OutPtr,
        ) {
            let (m, blocks) = (x.rows(), x.k / BLOCK);
            let (wstride, sstride) = group_stride::<WIDE_GROUP>(blocks);
            let groups = cols.start / WIDE_GROUP..cols.end / WIDE_GROUP;
            for g in groups.clone().step_by(2) {
                let at = (
                    w.values.as_ptr().add(g * wstride),
                    w.scales.as_ptr().add(g * sstride),
                    w.offset_sums.as_ptr().add(g * sstride),
                );
                let mut r = from;
                while r < m {
                    let n = (m - r).min(ROWS);
                    let rows = narrow_rows_from(x, r);
                    let col = g * WIDE_GROUP;
                    if groups.end - g >= 2 {
                        let acc = match n {
                            4 => signed512_rows::<4, 2>(at, rows),
                            3 => signed512_rows::<3, 2>(at, rows),
                            2 => signed512_rows::<2, 2>(at, rows),
                            _ => signed512_rows::<1, 2>(at, rows),
                        };
                        store512(&acc, n, out, r, col);
                    } else {
                        let acc = match n {
                            4 => signed512_rows::<4, 1>(at, rows),
                            3 => signed512_rows::<3, 1>(at, rows),
                            2 => signed512_rows::<2, 1>(at, rows),
                            _ => signed512_rows::<1, 1>(at, rows),
                        };
                        store512(&acc, n, out, r, col);
                    }
                    r += n;
                }
            }
        }

        /// [`dot512_rows`] for signed weights (see [`signed_avx512`]).
        #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn signed512_rows<const R: usize, const C: usize>(
            (weights, wscales, offset_sums): (*const i8, *const f32, *const i32),
            rows: NarrowRows,
        ) -> [[__m512; C]; ROWS] {
            let (wstride, sstride) = group_stride::<WIDE_GROUP>(rows.blocks);
            let mut acc = [[_mm512_setzero_ps(); C]; ROWS];
            for b in 0..rows.blocks {
                let start: [__m512i; C] = std::array::from_fn(|c| {
                    _mm512_loadu_si512(offset_sums.add(c * sstride + b * WIDE_GROUP) as *const _)
                });
                let mut sums = [start; ROWS];
                for q in 0..BLOCK / 4 {
                    // SAFETY: each group's block b holds 8 steps of 64 bytes.
                    let wq = weights.add((b * BLOCK / 4 + q) * WIDE_GROUP * 4);
                    let wv: [__m512i; C] = std::array::from_fn(|c| {
                        _mm512_loadu_si512(wq.add(c * wstride) as *const __m512i)
                    });
                    for (i, s) in sums.iter_mut().enumerate().take(R) {
                        // SAFETY: row i has k values; b * BLOCK + 4q + 4 <= k.
                        let at = rows.values.add(i * rows.k + b * BLOCK + 4 * q);
                        let four = (at as *const i32).read_unaligned() ^ (0x8080_8080u32 as i32);
                        let xv = _mm512_set1_epi32(four);
                        for (sc, wc) in s.iter_mut().zip(&wv) {
                            *sc = _mm512_dpbusd_epi32(*sc, xv, *wc);
                        }
                    }
                }
                let ws: [__m512; C] = std::array::from_fn(|c| {
                    _mm512_loadu_ps(wscales.add(c * sstride + b * WIDE_GROUP))
                });
                for (i, a) in acc.iter_mut().enumerate().take(R) {
                    let xs = _mm512_set1_ps(*rows.scales.add(i * rows.blocks + b));
                    for c in 0..C {
                        let scale = _mm512_mul_ps(ws[c], xs);
                        a[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[i][c]), scale, a[c]);
                    }
                }
            }
            acc
        }

        /// Activation rows per AMX tile.
        const TILE: usize = 16;

        /// Sixteen activation rows (some maybe padding): values `k` apart and
        /// their block scales `blocks` apart.
        #[derive(Clone, Copy)]
        struct TileRows {
            values: *const i8,
            scales: *const f32,
            k: usize,
            blocks: usize,
        }

        /// The sums of the first `R` of 16 activation rows against one group
        /// of 16 columns.
        #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn amx_rows<const R: usize>(
            (weights, wscales): (*const i8, *const f32),
            rows: TileRows,
        ) -> [__m512; TILE] {
            #[repr(C, align(64))]
            struct Sums([[[i32; WIDE_GROUP]; TILE]; RING]);
            // Not zeroed (8 KB per group of columns, which a profile showed
            // costing as much as the products): every slot is written by a
            // tile store before it is read.
            let mut sums = std::mem::MaybeUninit::<Sums>::uninit();
            let slots = sums.as_mut_ptr() as *mut i32;
            let slot = |b: usize| slots.add((b % RING) * TILE * WIDE_GROUP);
            let product = |b: usize| {
                // SAFETY: the thread is configured (`amx`); the tile reads
                // 16 rows of one block, `k` apart, and the group's 512 bytes
                // of block b, and writes 16 x 16 i32 to its slot of the ring.
                crate::amx::block_product(
                    rows.values.add(b * BLOCK),
                    rows.k,
                    weights.add(b * WIDE_GROUP * BLOCK),
                    slot(b),
                    b % 2 == 1,
                );
            };
            for b in 0..AHEAD.min(rows.blocks) {
                product(b);
            }
            let mut acc = [_mm512_setzero_ps(); TILE];
            for b in 0..rows.blocks {
                if b + AHEAD < rows.blocks {
                    product(b + AHEAD);
                }
                let block_sums = slot(b);
                let ws = _mm512_loadu_ps(wscales.add(b * WIDE_GROUP));
                for (i, a) in acc.iter_mut().enumerate().take(R) {
                    let sum = _mm512_load_si512(block_sums.add(i * WIDE_GROUP) as *const __m512i);
                    let xs = _mm512_set1_ps(*rows.scales.add(i * rows.blocks + b));
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(ws, xs), *a);
                }
            }
            acc
        }

        /// How many blocks ahead of the one being scaled the tile products
        /// run. Why: a vector load of what a tile store has just written
        /// waits for the store to leave the core; reading each block's sums
        /// straight after its product made the kernel slower than AVX-512
        /// VNNI (112 ns per 16 x 16 block instead of about 40).
        const AHEAD: usize = 7;
        /// Slots for the sums in flight: more than [`AHEAD`].
        const RING: usize = AHEAD + 1;

        /// [`dot_avx512`] on 256-bit registers, eight columns at a time,
        /// in either encoding of `vpdpbusd` (`$dpbusd`). Layout as
        /// [`dot_avx512`]'s with groups of eight columns (32-byte steps).
        macro_rules! dot_256 {
            ($name:ident, $rows:ident, $features:literal, $dpbusd:ident) => {
                #[target_feature(enable = $features)]
                pub(super) unsafe fn $name(
                    w: &Int8Matrix,
                    x: &Narrow,
                    cols: Range<usize>,
                    out: OutPtr,
                ) {
                    check_narrow(x);
                    let offset = w.layout().offset;
                    for_each_group_of::<GROUP, 1>(
                        w,
                        x.rows(),
                        x.k,
                        cols,
                        |weights, wscales, r, n, col, _| {
                            let rows = narrow_rows_from(x, r);
                            let acc = match n {
                                4 => $rows::<4>(weights, wscales, rows, offset),
                                3 => $rows::<3>(weights, wscales, rows, offset),
                                2 => $rows::<2>(weights, wscales, rows, offset),
                                _ => $rows::<1>(weights, wscales, rows, offset),
                            };
                            for (i, a) in acc.iter().enumerate().take(n) {
                                _mm256_storeu_ps(out.ptr.add((r + i) * out.ld + col), *a);
                            }
                        },
                    );
                }

                /// The eight columns' sums of `R` activation rows.
                #[target_feature(enable = $features)]
                #[inline]
                unsafe fn $rows<const R: usize>(
                    weights: *const i8,
                    wscales: *const f32,
                    rows: NarrowRows,
                    offset: i32,
                ) -> [__m256; ROWS] {
                    let mut acc = [_mm256_setzero_ps(); ROWS];
                    for b in 0..rows.blocks {
                        let mut sums = [_mm256_setzero_si256(); ROWS];
                        for (i, s) in sums.iter_mut().enumerate().take(R) {
                            *s = _mm256_set1_epi32(-offset * *rows.sums.add(i * rows.blocks + b));
                        }
                        for q in 0..BLOCK / 4 {
                            // SAFETY: the group's block b holds 8 steps of 32 bytes.
                            let wq = weights.add((b * BLOCK / 4 + q) * GROUP * 4);
                            let wv = _mm256_loadu_si256(wq as *const __m256i);
                            for (i, s) in sums.iter_mut().enumerate().take(R) {
                                // SAFETY: row i has k values; b * BLOCK + 4q + 4 <= k.
                                let at = rows.values.add(i * rows.k + b * BLOCK + 4 * q);
                                let xv = _mm256_set1_epi32((at as *const i32).read_unaligned());
                                *s = $dpbusd(*s, wv, xv);
                            }
                        }
                        let ws = _mm256_loadu_ps(wscales.add(b * GROUP));
                        for (i, a) in acc.iter_mut().enumerate().take(R) {
                            let xs = *rows.scales.add(i * rows.blocks + b);
                            let scale = _mm256_mul_ps(ws, _mm256_set1_ps(xs));
                            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[i]), scale, *a);
                        }
                    }
                    acc
                }
            };
        }

        dot_256!(
            dot_avx512_256,
            dot512_256_rows,
            "avx2,fma,avx512f,avx512vl,avx512vnni",
            _mm256_dpbusd_epi32
        );
        dot_256!(
            dot_avxvnni,
            dot_avxvnni_rows,
            "avx2,fma,avxvnni",
            _mm256_dpbusd_avx_epi32
        );

        #[target_feature(enable = "avx2,fma")]
        unsafe fn horizontal_sum(v: __m256) -> f32 {
            let pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let quad = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
            let one = _mm_add_ss(quad, _mm_shuffle_ps::<1>(quad, quad));
            _mm_cvtss_f32(one)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random matrix with a few large values, as
    /// trained weights and activations have.
    fn matrix(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..rows * cols)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                if i % 97 == 0 {
                    u * 8.0
                } else {
                    u
                }
            })
            .collect()
    }

    fn reference(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k).map(|i| x[r * k + i] * w[c * k + i]).sum();
            }
        }
        out
    }

    /// The worst error rounding to 8-bit blocks can cause in each product:
    /// every value moves by at most half its block's step.
    fn rounding_bound(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let step = |v: &[f32]| v.iter().fold(0f32, |a, b| a.max(b.abs())) / 127.0;
        let mut out = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k / BLOCK)
                    .map(|b| {
                        let (xs, ws) = (
                            &x[r * k + b * BLOCK..][..BLOCK],
                            &w[c * k + b * BLOCK..][..BLOCK],
                        );
                        let (dx, dw) = (step(xs) / 2.0, step(ws) / 2.0);
                        xs.iter()
                            .zip(ws)
                            .map(|(a, b)| b.abs() * dx + a.abs() * dw + dx * dw)
                            .sum::<f32>()
                    })
                    .sum();
            }
        }
        out
    }

    fn assert_within_rounding(w: &[f32], x: &[f32], m: usize, n: usize, k: usize, out: &[f32]) {
        let exact = reference(w, x, m, n, k);
        let bound = rounding_bound(w, x, m, n, k);
        for (i, ((o, e), b)) in out.iter().zip(&exact).zip(&bound).enumerate() {
            assert!(
                (o - e).abs() <= b * 1.001 + 1e-4,
                "m={m} [{i}]: {o} vs {e}, bound {b}"
            );
        }
    }

    #[test]
    fn every_build_of_the_f32_loops_gives_the_same_bits() {
        use simd::{Build, FORCED};
        let _serial = CALLS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        // Held open so that nothing leaves this thread (the build is forced
        // for this thread only).
        let _calls = (Call::enter(), Call::enter());
        let mut builds = vec![Build::Baseline];
        if cfg!(target_arch = "x86_64") {
            if Kernel::Avx2.is_supported() {
                builds.push(Build::Avx2);
            } else {
                eprintln!("int8-matmul tests: skipped the AVX2 build: this CPU lacks it");
            }
            if Kernel::Avx512Vnni.is_supported() {
                builds.push(Build::Avx512);
            } else {
                eprintln!("int8-matmul tests: skipped the AVX-512 build: this CPU lacks it");
            }
        }
        let (m, k, heads, dh) = (9, 384, 12, 32);
        let x: Vec<f32> = matrix(m, k, 71).iter().map(|v| v * 9.0).collect();
        let qkv = matrix(m, 3 * k, 72);
        let run = |build: Build| -> Vec<u32> {
            FORCED.set(Some(build));
            let blocks = m * k / BLOCK;
            let (mut wide, mut signed, mut offset) =
                (vec![0i16; m * k], vec![0i8; m * k], vec![0u8; m * k]);
            let (mut s1, mut s2, mut s3, mut sums) = (
                vec![0f32; blocks],
                vec![0f32; blocks],
                vec![0f32; blocks],
                vec![0i32; blocks],
            );
            quantize_wide(&x, &mut wide, &mut s1);
            quantize_signed(&x, &mut signed, &mut sums, &mut s2);
            quantize_offset(&x, &mut offset, &mut s3);
            let mut g = x.clone();
            ops::gelu_in_place(&mut g);
            let mut n = x.clone();
            let (gamma, beta) = (matrix(1, k, 73), matrix(1, k, 74));
            ops::add_layer_norm(&mut n, Some(&g), &gamma, &beta, 1e-12);
            let mut pooled = vec![0f32; k];
            ops::mean_pool_unit(&n, &mut pooled);
            let mut context = vec![0f32; m * k];
            let whole = 0..m;
            attention::attention(&qkv, std::slice::from_ref(&whole), heads, dh, &mut context);
            FORCED.set(None);
            let ints = wide
                .iter()
                .map(|&v| v as u32)
                .chain(signed.iter().map(|&v| v as u32))
                .chain(offset.iter().map(|&v| v as u32))
                .chain(sums.iter().map(|&v| v as u32));
            let floats = [s1, s2, s3, g, n, pooled, context].concat();
            ints.chain(floats.iter().map(|v| v.to_bits())).collect()
        };
        let baseline = run(Build::Baseline);
        for build in &builds[1..] {
            assert!(
                run(*build) == baseline,
                "the {build:?} build differs from the baseline"
            );
        }
    }

    #[test]
    fn quantising_rounds_as_f32_round_does() {
        let mut values: Vec<f32> = (-140 * 4096..=140 * 4096)
            .map(|i| i as f32 / 4096.0)
            .collect();
        // Either side of every half, where a shortcut would round wrongly.
        for i in -140..140 {
            let half = i as f32 + 0.5;
            values.extend([half.next_down(), half, half.next_up()]);
        }
        values.extend([0.49999997, -0.49999997, -0.0, 4194303.5, -4194303.5]);
        for v in values {
            let want = v.round();
            assert_eq!(round_half_away(v).to_bits(), want.to_bits(), "{v}");
            assert_eq!(integral_to_i32(want), want as i32, "{v}");
        }
    }

    #[test]
    fn products_are_close_to_f32_for_every_row_count() {
        let (n, k) = (96, 384);
        let w = matrix(n, k, 1);
        let q = Int8Matrix::quantize(&w, n, k);
        for m in [1, 2, 3, 4, 5, 9, 33] {
            let x = matrix(m, k, 7 + m as u64);
            let mut out = vec![0f32; m * n];
            q.matmul(&x, m, &mut out);
            assert_within_rounding(&w, &x, m, n, k, &out);
        }
    }

    /// The kernels this CPU can run, the portable one first; says which
    /// it skips, so that a run on a narrower CPU shows what it did not test.
    fn kernels() -> Vec<Kernel> {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            for k in Kernel::ALL.iter().filter(|k| !k.is_supported()) {
                eprintln!(
                    "int8-matmul tests: skipped the {} kernel: this CPU lacks {}",
                    k.name(),
                    k.needs()
                );
            }
            let ran: Vec<&str> = Kernel::available().iter().map(|k| k.name()).collect();
            eprintln!("int8-matmul tests: ran the {} kernels", ran.join(", "));
        });
        Kernel::available()
    }

    /// Every kernel's product of `values`/`scales` (through `build`) with
    /// `x`, asserting each gives the portable kernel's bits; returns the
    /// portable kernel's.
    fn same_bits_on_every_kernel(
        (m, n, k): (usize, usize, usize),
        x: &[f32],
        build: impl Fn(Kernel) -> Int8Matrix,
        what: &str,
    ) -> Vec<f32> {
        let mut portable: Option<Vec<f32>> = None;
        for kernel in kernels() {
            let q = build(kernel);
            assert_eq!(q.kernel(), kernel);
            let mut out = vec![0f32; m * n];
            q.matmul(x, m, &mut out);
            match &portable {
                None => portable = Some(out),
                Some(p) => {
                    let differ = out
                        .iter()
                        .zip(p)
                        .position(|(a, b)| a.to_bits() != b.to_bits());
                    assert!(
                        differ.is_none(),
                        "{kernel:?} differs from the portable kernel for {what} \
                         m={m} n={n} k={k} at {differ:?} (form {:?}, group {})",
                        q.form,
                        q.group,
                    );
                }
            }
        }
        portable.expect("the portable kernel runs anywhere")
    }

    #[test]
    fn every_kernel_matches_portable_on_ragged_and_real_shapes() {
        // Short texts give 1..9 tokens; odd numbers of blocks; columns that
        // are a multiple of 16, of 8 only (the AVX-512 kernel's 8-column
        // fallback), and of neither (the row form); and the encoders' own
        // shapes (hidden 384, fused qkv 1152, intermediate 1536).
        let mut shapes = Vec::new();
        for m in 1..=9 {
            for (n, k) in [(16, 32), (24, 96), (40, 160), (36, 96), (8, 416)] {
                shapes.push((m, n, k));
            }
        }
        for m in [1, 7, 20, 37] {
            for (n, k) in [(384, 384), (1152, 384), (1536, 384), (384, 1536)] {
                shapes.push((m, n, k));
            }
        }
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            let seed = 100 + i as u64;
            let x: Vec<f32> = matrix(m, k, seed).iter().map(|v| v * 6.0).collect();
            // MiniLM's: f32 weights quantised to 8 bits.
            let w = matrix(n, k, seed + 1);
            let out = same_bits_on_every_kernel(
                (m, n, k),
                &x,
                |kernel| Int8Matrix::quantize_with(&w, n, k, kernel).unwrap(),
                "8-bit weights",
            );
            assert_within_rounding(&w, &x, m, n, k, &out);
            // e5's: 4-bit weights widened.
            let (values, scales, w) = narrow_matrix(n, k, seed + 2);
            let out = same_bits_on_every_kernel(
                (m, n, k),
                &x,
                |kernel| {
                    Int8Matrix::from_blocks_with(values.clone(), scales.clone(), n, k, kernel)
                        .unwrap()
                },
                "4-bit weights",
            );
            assert_within_rounding(&w, &x, m, n, k, &out);
        }
    }

    #[test]
    fn every_kernel_is_exact_at_the_byte_extremes() {
        // -128 is outside what quantising gives but an i8 all the same:
        // every kernel must take it (the VNNI ones offset it to 0).
        let (n, k, m) = (32, 96, 5);
        for weights in [[-128i8, 127], [-127, 127], [-8, 8], [-8, 7]] {
            let values: Vec<i8> = (0..n * k).map(|i| weights[(i % 3 == 0) as usize]).collect();
            let scales = vec![1.0f32; n * k / BLOCK];
            let w: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            for sign in [1.0f32, -1.0] {
                let x: Vec<f32> = (0..m * k)
                    .map(|i| {
                        if i % 5 == 0 {
                            -127.0 * sign
                        } else {
                            127.0 * sign
                        }
                    })
                    .collect();
                let out = same_bits_on_every_kernel(
                    (m, n, k),
                    &x,
                    |kernel| {
                        Int8Matrix::from_blocks_for(values.clone(), scales.clone(), n, k, kernel)
                    },
                    "extreme weights",
                );
                assert_eq!(out, reference(&w, &x, m, n, k), "weights {weights:?}");
            }
        }
    }

    #[test]
    fn kernel_names_parse_and_refusals_say_why() {
        for kernel in Kernel::ALL {
            assert_eq!(kernel.name().parse(), Ok(KernelChoice::Force(kernel)));
        }
        assert_eq!("auto".parse(), Ok(KernelChoice::Auto));
        assert_eq!("amx".parse(), Ok(KernelChoice::Force(Kernel::Amx)));
        let err = "avx512".parse::<KernelChoice>().unwrap_err();
        assert!(err.contains("avx512vnni"), "{err}");
        // Forcing AMX: refused on a CPU (or kernel) without it, naming the
        // kernels there are; taken (or already the choice) where it runs.
        let amx = choose_kernel(KernelChoice::Force(Kernel::Amx));
        if Kernel::Amx.is_supported() {
            // Taken, unless another test of this process already chose
            // (auto keeps AVX-512 VNNI on such a CPU).
            assert!(
                amx == Ok(Kernel::Amx)
                    || amx
                        == Err(ChoiceError::AlreadyChosen {
                            kept: Kernel::best_of_cpu()
                        }),
                "{amx:?}"
            );
        } else {
            let err = amx.unwrap_err();
            assert_eq!(err, ChoiceError::Unsupported(Kernel::Amx));
            let said = err.to_string();
            assert!(
                said.contains("amx-int8") && said.contains("\"auto\""),
                "{said}"
            );
            assert!(said.contains(Kernel::best_of_cpu().name()), "{said}");
        }
        let unsupported = ChoiceError::Unsupported(Kernel::Avx512Vnni).to_string();
        assert!(unsupported.contains("avx512vnni"), "{unsupported}");
        // The process's choice is auto (nothing in the tests forces one):
        // asking for it again is fine, asking for another kernel is not.
        assert_eq!(choose_kernel(KernelChoice::Auto), Ok(Kernel::best_of_cpu()));
        if Kernel::best_of_cpu() != Kernel::Portable {
            assert_eq!(
                choose_kernel(KernelChoice::Force(Kernel::Portable)),
                Err(ChoiceError::AlreadyChosen {
                    kept: Kernel::best_of_cpu()
                })
            );
        }
    }

    #[test]
    fn a_cpu_with_amx_can_run_the_amx_kernel() {
        // Linux lists amx_int8 and amx_tile only when it supports them (5.16
        // and later); then the permission and the self-check must succeed,
        // or every AMX server would silently run the AVX-512 kernel.
        let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let listed = |f: &str| flags.split_whitespace().any(|w| w == f);
        if !(listed("amx_int8") && listed("amx_tile") && listed("avx512_vnni")) {
            eprintln!("int8-matmul tests: skipped the AMX detection check: no AMX listed");
            return;
        }
        assert!(Kernel::Amx.is_supported(), "AMX is listed but not usable");
        assert_eq!(
            Kernel::best_of_cpu(),
            Kernel::Avx512Vnni,
            "auto does not pick AMX"
        );
    }

    #[test]
    fn auto_picks_the_widest_kernel_the_cpu_has_short_of_amx() {
        let best = Kernel::best_of_cpu();
        assert!(best.is_supported() && best != Kernel::Amx);
        assert!(Kernel::ALL
            .iter()
            .all(|k| *k <= best || *k == Kernel::Amx || !k.is_supported()));
    }

    #[test]
    fn blocks_given_as_integers_multiply_exactly_on_every_kernel() {
        // Weights that are small integers times a power-of-two scale per
        // block, like widened 4-bit weights: from_blocks must not re-round
        // them, so the product is exact for integer activations.
        let (n, k, m) = (8, 64, 5);
        let values: Vec<i8> = (0..n * k).map(|i| (i % 16) as i8 - 8).collect();
        let scales: Vec<f32> = (0..n * k / BLOCK)
            .map(|b| 0.25 * (1 + b % 3) as f32)
            .collect();
        let w: Vec<f32> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| v as f32 * scales[i / BLOCK])
            .collect();
        // Each activation block holds ±127 so it quantises with scale 1.
        let x: Vec<f32> = (0..m * k)
            .map(|i| {
                if i % BLOCK == 0 {
                    127.0
                } else {
                    (i % 7) as f32 - 3.0
                }
            })
            .collect();
        let exact = reference(&w, &x, m, n, k);
        for kernel in kernels() {
            let q = Int8Matrix::from_blocks_for(values.clone(), scales.clone(), n, k, kernel);
            let mut out = vec![0f32; m * n];
            q.matmul(&x, m, &mut out);
            assert_eq!(out, exact, "{kernel:?}");
        }
    }

    /// Pseudo-random 4-bit weights widened to `i8` (`[-8, 7]`, as e5's),
    /// with their block scales, and the f32 matrix they stand for.
    fn narrow_matrix(rows: usize, cols: usize, seed: u64) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
        let noise = matrix(rows, cols, seed);
        let values: Vec<i8> = noise
            .iter()
            .map(|v| ((v * 16.0).round() as i32).clamp(-8, 7) as i8)
            .collect();
        let scales: Vec<f32> = matrix(rows * cols / BLOCK, 1, seed + 1)
            .iter()
            .map(|v| 0.01 + v.abs() * 0.05)
            .collect();
        let w = values
            .iter()
            .enumerate()
            .map(|(i, &v)| v as f32 * scales[i / BLOCK])
            .collect();
        (values, scales, w)
    }

    #[test]
    fn each_matrix_takes_the_form_its_weights_allow() {
        let (values, scales, _) = narrow_matrix(16, 64, 11);
        let q = Int8Matrix::from_blocks(values.clone(), scales.clone(), 16, 64);
        assert_eq!(q.form, Form::Narrow);
        // One weight of 9: grouped; quantised f32 weights use the whole
        // 8-bit range: grouped too.
        let mut wide = values.clone();
        wide[5] = 9;
        let q = Int8Matrix::from_blocks(wide, scales.clone(), 16, 64);
        assert_eq!(q.form, Form::Grouped);
        let q = Int8Matrix::quantize(&matrix(16, 64, 3), 16, 64);
        assert_eq!(q.form, Form::Grouped);
        // Rows not a multiple of the group: row form, whatever the weights.
        let q = Int8Matrix::from_blocks(values[..12 * 64].to_vec(), scales[..24].to_vec(), 12, 64);
        assert_eq!(q.form, Form::Rows);
        assert_eq!(
            Int8Matrix::quantize(&matrix(12, 64, 3), 12, 64).form,
            Form::Rows
        );
    }

    #[test]
    fn narrow_products_are_close_to_f32_and_the_same_bits_on_every_kernel() {
        let (n, k) = (48, 384);
        let (values, scales, w) = narrow_matrix(n, k, 21);
        for m in [1, 2, 3, 4, 5, 9, 33, 70] {
            // Activations with a few large values, as a layer's are.
            let x: Vec<f32> = matrix(m, k, 30 + m as u64)
                .iter()
                .map(|v| v * 6.0)
                .collect();
            let results: Vec<(Kernel, Vec<f32>)> = kernels()
                .into_iter()
                .map(|kernel| {
                    let q =
                        Int8Matrix::from_blocks_for(values.clone(), scales.clone(), n, k, kernel);
                    assert_eq!(q.form, Form::Narrow);
                    let mut out = vec![0f32; m * n];
                    q.matmul(&x, m, &mut out);
                    (kernel, out)
                })
                .collect();
            let (_, portable) = &results[0];
            assert_within_rounding(&w, &x, m, n, k, portable);
            for (kernel, out) in &results[1..] {
                let same = out
                    .iter()
                    .zip(portable)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{kernel:?} differs from the portable kernel at m={m}");
            }
        }
    }

    #[test]
    fn narrow_blocks_at_the_extremes_do_not_overflow() {
        // Every weight -8 or 8 and every activation ±127: the 16-bit sums
        // reach their bound, and the product must still be exact.
        let (n, k, m) = (8, 64, 3);
        let values: Vec<i8> = (0..n * k)
            .map(|i| if i % 3 == 0 { -8 } else { 8 })
            .collect();
        let scales = vec![1.0f32; n * k / BLOCK];
        let w: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        for sign in [1.0f32, -1.0] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| {
                    if i % 5 == 0 {
                        -127.0 * sign
                    } else {
                        127.0 * sign
                    }
                })
                .collect();
            let exact = reference(&w, &x, m, n, k);
            for kernel in kernels() {
                let q = Int8Matrix::from_blocks_for(values.clone(), scales.clone(), n, k, kernel);
                assert_eq!(q.form, Form::Narrow);
                let mut out = vec![0f32; m * n];
                q.matmul(&x, m, &mut out);
                assert_eq!(out, exact, "{kernel:?}");
            }
        }
    }

    #[test]
    fn grouped_blocks_at_the_extremes_are_exact() {
        // Every weight and activation ±127: a block's sum reaches 516,128,
        // which the 32-bit lanes and the f32 it is scaled in hold exactly.
        let (n, k, m) = (8, 64, 3);
        let values: Vec<i8> = (0..n * k)
            .map(|i| if i % 3 == 0 { -127 } else { 127 })
            .collect();
        let scales = vec![1.0f32; n * k / BLOCK];
        let w: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        let x: Vec<f32> = (0..m * k)
            .map(|i| if i % 5 == 0 { -127.0 } else { 127.0 })
            .collect();
        let exact = reference(&w, &x, m, n, k);
        for kernel in kernels() {
            let q = Int8Matrix::from_blocks_for(values.clone(), scales.clone(), n, k, kernel);
            assert_eq!(q.form, Form::Grouped);
            let mut out = vec![0f32; m * n];
            q.matmul(&x, m, &mut out);
            assert_eq!(out, exact, "{kernel:?}");
        }
    }

    #[test]
    fn large_narrow_products_split_across_threads_keep_their_bits() {
        let _serial = CALLS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let (m, n, k) = (40, 200, 256);
        let (values, scales, w) = narrow_matrix(n, k, 41);
        let q = Int8Matrix::from_blocks(values, scales, n, k);
        let x = matrix(m, k, 42);
        let (mut alone, mut crowded) = (vec![0f32; m * n], vec![0f32; m * n]);
        let before = SPLITS.get();
        {
            let _call = Call::enter();
            q.matmul(&x, m, &mut alone);
            assert_eq!(SPLITS.get(), before + 1, "a call alone splits it");
            let _other = Call::enter();
            q.matmul(&x, m, &mut crowded);
        }
        assert_within_rounding(&w, &x, m, n, k, &alone);
        assert_eq!(
            alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            crowded.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn every_kernel_gives_the_portable_kernels_bits() {
        // 40 rows: the grouped form; 36: the row form.
        for (n, k, m) in [40, 36]
            .into_iter()
            .flat_map(|n| [1, 4, 6, 37].map(|m| (n, 128, m)))
        {
            let w = matrix(n, k, 3);
            let x = matrix(m, k, 4 + m as u64);
            let results: Vec<(Kernel, Vec<f32>)> = kernels()
                .into_iter()
                .map(|kernel| {
                    let mut out = vec![0f32; m * n];
                    Int8Matrix::quantize_for(&w, n, k, kernel).matmul(&x, m, &mut out);
                    (kernel, out)
                })
                .collect();
            let (_, portable) = &results[0];
            assert_within_rounding(&w, &x, m, n, k, portable);
            for (kernel, out) in &results[1..] {
                let same = out
                    .iter()
                    .zip(portable)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{kernel:?} differs from the portable kernel at n={n} m={m}"
                );
            }
        }
    }

    #[test]
    fn this_machine_uses_a_simd_kernel() {
        // CI runs on x86-64 with AVX2; a silent fall back to the portable
        // loop would make the encoder many times slower.
        if cfg!(target_arch = "x86_64") {
            assert_ne!(Kernel::detect(), Kernel::Portable);
        }
    }

    #[test]
    fn large_products_split_across_threads_keep_column_order() {
        let (m, n, k) = (40, 200, 256);
        let w = matrix(n, k, 5);
        let x = matrix(m, k, 6);
        let q = Int8Matrix::quantize(&w, n, k);
        let mut out = vec![0f32; m * n];
        q.matmul(&x, m, &mut out);
        assert_within_rounding(&w, &x, m, n, k, &out);
    }

    /// Serialises the tests that count calls or splits: the count is the
    /// process's.
    pub(crate) static CALLS_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn products_stay_whole_while_calls_wait_and_keep_their_bits() {
        let _serial = CALLS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let (m, n, k) = (40, 200, 256);
        let q = Int8Matrix::quantize(&matrix(n, k, 5), n, k);
        let x = matrix(m, k, 6);
        let splits = || SPLITS.get();
        let (mut alone, mut crowded, mut after) =
            (vec![0f32; m * n], vec![0f32; m * n], vec![0f32; m * n]);
        let before = splits();
        {
            let _call = Call::enter();
            q.matmul(&x, m, &mut alone);
            assert_eq!(
                splits(),
                before + 1,
                "a call alone splits a product this large"
            );
            let _other = Call::enter();
            q.matmul(&x, m, &mut crowded);
            assert_eq!(
                splits(),
                before + 1,
                "with another call waiting it does not"
            );
        }
        assert_eq!(
            alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            crowded.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        q.matmul(&x, m, &mut after);
        assert_eq!(
            splits(),
            before + 2,
            "calls are counted only while they live"
        );
    }

    #[test]
    fn zero_and_non_finite_blocks_do_not_poison_others() {
        let (n, k) = (2, 64);
        let mut w = matrix(n, k, 8);
        w[..BLOCK].fill(0.0);
        let q = Int8Matrix::quantize(&w, n, k);
        let x = matrix(1, k, 9);
        let mut out = vec![0f32; n];
        q.matmul(&x, 1, &mut out);
        assert!(out.iter().all(|v| v.is_finite()));
    }
}
