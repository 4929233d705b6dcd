//! Arbitrary client input through the image path must give Ok or an
//! ImageError: never a panic, a hang or an allocation past the limits.
//! The input layout is documented on `exercise_untrusted_input`; crashing
//! inputs go to tests/fixtures/images/fuzz/, which a unit test replays.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    moderato::moderation::image::exercise_untrusted_input(data);
});
