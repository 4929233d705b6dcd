//! Intel AMX: detection, Linux's permission for the tile state, the tile
//! configuration of each thread, and the one tile product the kernel uses.
//!
//! `is_x86_feature_detected!("amx-int8")` is unstable on this Rust, so the
//! CPU is asked directly (CPUID leaf 7 and XCR0), and the instructions are
//! written with `asm!`. All `unsafe` AMX code of the project is here and in
//! the kernel that calls [`block_product`] (`kernel::x86::amx`).

use std::sync::OnceLock;

/// Whether this process can use the AMX kernel: the CPU has AMX-TILE and
/// AMX-INT8, the OS enabled the tile state in XCR0, Linux granted this
/// process the tile data, and the kernel gave the portable kernel's bits on
/// a small random product. Decided once; a refusal is logged once.
pub(crate) fn works() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        if !cpu_has_amx() {
            return false;
        }
        if let Err(why) = request_tile_state() {
            tracing::warn!(
                error = %why,
                "this CPU has AMX but Linux refused the tile state; the AMX kernel is not used"
            );
            return false;
        }
        if !crate::amx_self_check() {
            tracing::error!(
                "the AMX kernel's start-up self-check gave other results than the portable \
                 kernel; the AMX kernel is not used"
            );
            return false;
        }
        true
    })
}

/// AMX-TILE, AMX-INT8 (and AMX-BF16, which every AMX CPU has: asked for so
/// that a hypervisor's odd mask is refused) in CPUID leaf 7, and the tile
/// configuration and data enabled by the OS in XCR0 (bits 17 and 18).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn cpu_has_amx() -> bool {
    use std::arch::x86_64::__cpuid_count;
    let (max_leaf, leaf1, leaf7) = (
        __cpuid_count(0, 0).eax,
        __cpuid_count(1, 0),
        __cpuid_count(7, 0),
    );
    const AMX: u32 = (1 << 22) | (1 << 24) | (1 << 25);
    const OSXSAVE: u32 = 1 << 27;
    if max_leaf < 7 || leaf7.edx & AMX != AMX || leaf1.ecx & OSXSAVE == 0 {
        return false;
    }
    const TILE_STATE: u64 = (1 << 17) | (1 << 18);
    xcr0() & TILE_STATE == TILE_STATE
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn cpu_has_amx() -> bool {
    false
}

/// XCR0, the state components the OS saves and restores.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn xcr0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: XGETBV with ECX = 0 is valid when CPUID says OSXSAVE, which
    // the caller checked.
    unsafe {
        std::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi,
                        options(nomem, nostack, preserves_flags));
    }
    ((hi as u64) << 32) | lo as u64
}

/// Asks Linux for the tile data state for the whole process (every thread,
/// existing or not). Without it the first tile instruction kills the
/// process with SIGILL.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_state() -> std::io::Result<()> {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with integer arguments.
    let done = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tile_state() -> std::io::Result<()> {
    Err(std::io::Error::other("AMX is used on x86-64 Linux only"))
}

#[cfg(target_arch = "x86_64")]
pub(crate) use tiles::{block_product, configure_thread};

#[cfg(target_arch = "x86_64")]
mod tiles {
    /// The tiles, for every product (palette 1):
    /// - `tmm0`, `tmm1`: sums, 16 rows x 16 `i32` (64 bytes), for even and odd
    ///   blocks, so that one block's product can start while the previous
    ///   block's sums are still being stored;
    /// - `tmm2`, `tmm4`: activations, 16 rows x one block (32 bytes);
    /// - `tmm3`, `tmm5`: weights, 8 rows of 64 bytes: for each of 16 columns
    ///   four consecutive weights of the block (the layout `tdpbssd` reads).
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        /// Bytes per row of each tile.
        colsb: [u16; 16],
        /// Rows of each tile.
        rows: [u8; 16],
    }

    const CONFIG: TileConfig = {
        let mut colsb = [0u16; 16];
        let mut rows = [0u8; 16];
        let shapes: [(u16, u8); 6] = [(64, 16), (64, 16), (32, 16), (64, 8), (32, 16), (64, 8)];
        let mut t = 0;
        while t < shapes.len() {
            colsb[t] = shapes[t].0;
            rows[t] = shapes[t].1;
            t += 1;
        }
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb,
            rows,
        }
    };

    thread_local! {
        /// Whether this thread's tile configuration is [`CONFIG`]. It is
        /// per-thread state that Linux saves and restores with the rest of the
        /// thread's registers (XSAVE) once the process has the permission, so it
        /// is loaded once per thread; nothing in this process releases or
        /// reconfigures the tiles.
        static CONFIGURED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Loads [`CONFIG`] on this thread if it is not yet.
    ///
    /// # Safety
    /// [`works`] must have returned true (or be running its self-check, after
    /// the permission was granted).
    #[inline]
    pub(crate) unsafe fn configure_thread() {
        CONFIGURED.with(|done| {
            if !done.get() {
                // SAFETY: the permission is granted (caller) and CONFIG is a
                // valid palette-1 configuration, 64 bytes, 64-aligned.
                std::arch::asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig,
                                options(nostack, readonly, preserves_flags));
                done.set(true);
            }
        });
    }

    /// `sums[i][c] = Σ_j a[i * lda + j] * b[j / 4][4c + j % 4]` for 16 rows
    /// `i`, 16 columns `c` and one block of 32 `j`: signed bytes times signed
    /// bytes, summed exactly in `i32`. `a` is 16 rows of one block's 32
    /// activations, `lda` bytes apart; `b` the 512 bytes of one block of a
    /// group of 16 columns (8 rows of 64 bytes); `sums` 16 x 16 `i32`, 64-byte
    /// rows. `odd` picks the second set of tiles (see [`TileConfig`]).
    ///
    /// # Safety
    /// [`configure_thread`] was called on this thread; the three pointers
    /// cover what is read and written.
    #[inline(always)]
    pub(crate) unsafe fn block_product(
        a: *const i8,
        lda: usize,
        b: *const i8,
        sums: *mut i32,
        odd: bool,
    ) {
        if odd {
            std::arch::asm!(
                "tilezero tmm1",
                "tileloadd tmm4, [{a} + {lda} * 1]",
                "tileloadd tmm5, [{b} + {ldb} * 1]",
                "tdpbssd tmm1, tmm4, tmm5",
                "tilestored [{c} + {ldc} * 1], tmm1",
                a = in(reg) a, lda = in(reg) lda, b = in(reg) b, ldb = in(reg) 64usize,
                c = in(reg) sums, ldc = in(reg) 64usize,
                options(nostack, preserves_flags),
            );
        } else {
            std::arch::asm!(
                "tilezero tmm0",
                "tileloadd tmm2, [{a} + {lda} * 1]",
                "tileloadd tmm3, [{b} + {ldb} * 1]",
                "tdpbssd tmm0, tmm2, tmm3",
                "tilestored [{c} + {ldc} * 1], tmm0",
                a = in(reg) a, lda = in(reg) lda, b = in(reg) b, ldb = in(reg) 64usize,
                c = in(reg) sums, ldc = in(reg) 64usize,
                options(nostack, preserves_flags),
            );
        }
    }
}
