//! The builtin adapter.

#[derive(Debug)]
pub struct BuiltinAdapter;
pub const BUILTIN_NAMES: &[&str] = &[];
