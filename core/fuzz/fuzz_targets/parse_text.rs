//! Fuzz target: the text parser on arbitrary UTF-8 input must return `Ok` or a positioned
//! error, never panic or overflow the stack; whatever parses must verify and print, and the
//! printed text must parse again (with the printed constants) and print identically.

#![no_main]

use fusebox_core::text::{ConstTable, NS_CONSTANT, parse_module, parse_module_str, print_module};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    match parse_module_str(src) {
        Ok(m) => {
            if let Err(e) = fusebox_core::ir::verify::verify(&m) {
                panic!("a parsed module does not verify: {e}");
            }
            let printed = print_module(&m);
            let mut consts = ConstTable::new();
            for (i, c) in printed.constants.iter().enumerate() {
                consts.insert(NS_CONSTANT, printed.first_index + i, c.clone());
            }
            match parse_module(&printed.text, "<printed>", &consts) {
                Ok(m2) => assert_eq!(
                    print_module(&m2).text,
                    printed.text,
                    "print is not a fixed point"
                ),
                Err(e) => panic!("printed text does not parse: {e}\n{}", printed.text),
            }
        }
        Err(e) => {
            assert!(
                e.as_source().is_some(),
                "parse error without a position: {e}"
            );
        }
    }
});
