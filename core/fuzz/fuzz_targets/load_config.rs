//! Fuzz target: the config loader never panics on any text, and a config that parses has
//! errors (if any later) that are plain values.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    if let Ok(c) = fusebox_core::config::Config::parse(src, "fuzz.toml") {
        // Positioned errors at every recorded span must not panic either.
        for b in &c.backends {
            let _ = c.error_at(b.span.clone(), "x").to_string();
        }
        for p in &c.plugins {
            let _ = c.error_at(p.span.clone(), "x").to_string();
        }
    }
});
