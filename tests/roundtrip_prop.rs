//! Property test: random well-typed modules (up to hundreds of bindings, tuples, symbolic dims,
//! scalar constants, dataflow and plain blocks) verify, and print → parse gives a structurally
//! equal module whose printing is identical.

#![allow(clippy::panic, reason = "test code: a failure is a panic")]

mod common;

use fusebox_core::ir::generate::random_module;
use fusebox_core::ir::structural::{function_hash, module_eq};
use fusebox_core::ir::verify::verify;
use fusebox_core::text;
use proptest::prelude::*;

proptest! {
    #![proptest_config(common::prop_config(64))]

    #[test]
    fn print_parse_is_structurally_equal(seed in any::<u64>(), ops in 1usize..400) {
        let m = random_module(seed, ops);
        prop_assert!(m.get("main").is_some());
        if let Err(e) = verify(&m) {
            panic!("generated module does not verify: {e}");
        }
        let printed = text::print_module(&m);
        let parsed = match text::parse_module_str(&printed.text) {
            Ok(p) => p,
            Err(e) => panic!("printed module does not parse: {e}\n{}", printed.text),
        };
        prop_assert!(module_eq(&m, &parsed), "not structurally equal:\n{}", printed.text);
        if let (Some(a), Some(b)) = (m.get("main"), parsed.get("main")) {
            prop_assert_eq!(function_hash(a), function_hash(b));
        }
        prop_assert_eq!(&printed.text, &text::print_module(&parsed).text);
        prop_assert!(verify(&parsed).is_ok());
    }

    #[test]
    fn structural_equality_ignores_names_but_not_structure(seed in any::<u64>(), ops in 2usize..120) {
        let m = random_module(seed, ops);
        let printed = text::print_module(&m).text;
        // Renaming every var keeps the module structurally equal.
        let renamed_src = printed.replace("lv", "tmp_v");
        let renamed = text::parse_module_str(&renamed_src);
        if let Ok(renamed) = renamed {
            prop_assert!(module_eq(&m, &renamed));
        }
        // A different module (another seed) is not equal unless its text is identical.
        let other = random_module(seed ^ 0x5555, ops);
        let same_text = text::print_module(&other).text == printed;
        prop_assert_eq!(module_eq(&m, &other), same_text);
    }
}
