//! The command adapter.

#[derive(Debug)]
pub struct CommandAdapter;
