//! MCP (Model Context Protocol) on both sides of the gateway.
//!
//! - [`front`]: agents connect with any MCP client to `/mcp` (Streamable HTTP); every
//!   `tools/call` runs the 13-step pipeline and is audited like an HTTP API call.
//! - [`crate::adapter::mcp`] (the other side, with the other adapters): a registry
//!   tool can be executed by a tool on an upstream MCP server, over stdio (the gateway
//!   starts and supervises the server) or Streamable HTTP.
//! - `signals`: progress relayed to, and cancellation from, the client of a call
//!   in flight.
//! - [`import`]: `toolgate mcp import` lists an upstream server's tools and prints
//!   registry entries for a person to review.
//!
//! The protocol itself (JSON-RPC framing, the transports, version negotiation) is
//! the official Rust SDK's (`rmcp`); this module maps it onto the gateway.

pub mod front;
pub mod import;
pub(crate) mod signals;
pub mod transport;
