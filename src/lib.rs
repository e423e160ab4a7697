//! The `fusebox` facade: re-exports fusebox-core and links every built-in backend crate so that
//! their `inventory` registrations are kept by the linker.

pub use fusebox_core as core;
