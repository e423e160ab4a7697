//! Unit tests of the op set.

use super::*;

#[test]
fn placeholder() {}
