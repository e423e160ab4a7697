//! FFI (pending)
