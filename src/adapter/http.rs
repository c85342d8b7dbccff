//! The http adapter.

#[derive(Debug)]
pub struct HttpAdapter;
