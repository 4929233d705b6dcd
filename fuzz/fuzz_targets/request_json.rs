//! Arbitrary request bodies through the strict JSON check that runs before
//! the typed parse: it must return, never panic or overflow the stack, and
//! whatever it lets through as valid JSON must be an object.
//!
//! Compiled in from the service's source, like `image_decode`, so that an
//! instrumented build compiles serde_json and not the whole service.

#![no_main]

#[allow(dead_code)]
#[path = "../../src/http/strict_json.rs"]
#[rustfmt::skip]
mod strict_json;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if strict_json::check(data).is_none() {
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
            assert!(value.is_object(), "a non-object body passed the check");
        }
    }
});
