//! One body, two builds: a loop written once is compiled both for the
//! baseline x86-64 (SSE2) and with AVX2 enabled, and the AVX2 build is
//! chosen at run time when the CPU has it. The bodies use no fused
//! multiply-adds and sum reductions in eight explicit lanes, so both builds
//! round identically: embeddings do not depend on the CPU's features.

use std::sync::OnceLock;

pub(crate) fn has_avx2() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && crate::Kernel::detect() != crate::Kernel::Portable
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Defines `fn name(args) body` as a dispatcher between the two builds.
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
                if $crate::simd::has_avx2() {
                    // SAFETY: the CPU has AVX2.
                    return unsafe { avx2($($arg),*) };
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
