//! Arbitrary client input through the image path must give Ok or an
//! ImageError: never a panic, a hang or an allocation past the limits.
//! The input layout is documented on `exercise_untrusted_input`; crashing
//! inputs go to tests/fixtures/images/fuzz/, which a unit test replays.
//!
//! The module is compiled in from the service's source rather than through
//! the `moderato` crate so that an instrumented build compiles only the
//! image stack, not candle, sqlx and axum.

#![no_main]

#[allow(dead_code, unused_imports)]
#[path = "../../src/moderation/image/decode.rs"]
#[rustfmt::skip] // formatted with the main crate; rustfmt cannot follow its test module from here
mod image_path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    image_path::exercise_untrusted_input(data);
});
