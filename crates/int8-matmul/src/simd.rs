//! One body, three builds: a loop written once is compiled for the
//! baseline x86-64 (SSE2), with AVX2 enabled and with AVX-512 enabled, and
//! the widest build the process's kernel allows is chosen at run time. The
//! bodies use no fused multiply-adds (Rust never contracts `a * b + c`) and
//! sum reductions in eight explicit lanes, so every build rounds
//! identically: embeddings do not depend on the CPU's features.

use std::sync::OnceLock;

/// The builds of a [`dispatch`]ed body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Build {
    Baseline,
    Avx2,
    /// 512-bit registers: twice the values per instruction of AVX2 in the
    /// element-wise loops (GELU, quantising, layer norm, attention).
    Avx512,
}

#[cfg(test)]
thread_local! {
    /// A build forced by a test on its own thread.
    pub(crate) static FORCED: std::cell::Cell<Option<Build>> = const { std::cell::Cell::new(None) };
}

/// The widest build the process's kernel allows: AVX-512 only with the
/// AVX-512 VNNI and AMX kernels (so forcing `avx2` measures what AVX2 machines run),
/// none with the portable kernel.
pub(crate) fn build() -> Build {
    #[cfg(test)]
    if let Some(forced) = FORCED.get() {
        return forced;
    }
    static BUILD: OnceLock<Build> = OnceLock::new();
    *BUILD.get_or_init(|| match crate::Kernel::detect() {
        crate::Kernel::Portable => Build::Baseline,
        crate::Kernel::Avx512Vnni | crate::Kernel::Amx => Build::Avx512,
        // Every other kernel needs AVX2 (`Kernel::is_supported`).
        crate::Kernel::Avx2 | crate::Kernel::AvxVnni => Build::Avx2,
    })
}

/// Defines `fn name(args) body` as a dispatcher between the builds.
macro_rules! dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw")]
                unsafe fn avx512($($arg: $ty),*) {
                    body($($arg),*)
                }
                match $crate::simd::build() {
                    // SAFETY: `build` picks a build only for a kernel whose
                    // features the CPU has (`Kernel::is_supported`).
                    $crate::simd::Build::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::simd::Build::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::simd::Build::Baseline => {}
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use dispatch;

/// Values summed side by side by the reductions.
pub(crate) const LANES: usize = 8;

/// The sum of eight lanes, pairwise in a fixed order (the same as the int8
/// kernels' horizontal sum).
#[inline(always)]
pub(crate) fn lane_sum(acc: [f32; LANES]) -> f32 {
    let pair: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
    (pair[0] + pair[2]) + (pair[1] + pair[3])
}

/// `Σ f(x[i])`, in lanes.
#[inline(always)]
pub(crate) fn sum_by(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += f(*v);
        }
    }
    for (a, v) in acc.iter_mut().zip(rest) {
        *a += f(*v);
    }
    lane_sum(acc)
}

/// The largest value (`-inf` for none), in lanes.
#[inline(always)]
pub(crate) fn max_of(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = if *v > *a { *v } else { *a };
        }
    }
    for (a, v) in acc.iter_mut().zip(rest) {
        *a = if *v > *a { *v } else { *a };
    }
    acc.into_iter()
        .fold(f32::NEG_INFINITY, |m, v| if v > m { v } else { m })
}
