//! Fuzz target: the pattern text syntax and pattern tables in TOML never panic; a pattern that
//! parses prints to text that parses to the same printed form.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    if let Ok(p) = fusebox_core::pattern::parse_pattern(src) {
        let printed = p.to_string();
        match fusebox_core::pattern::parse_pattern(&printed) {
            Ok(q) => assert_eq!(q.to_string(), printed, "print is not a fixed point"),
            Err(e) => panic!("printed pattern does not parse: {printed}\n{e}"),
        }
    }
    let _ = fusebox_core::pattern_table::parse_pattern_table(src, "fuzz.toml");
});
