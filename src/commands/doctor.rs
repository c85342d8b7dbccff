//! `toolgate doctor`: what this host can enforce for sandboxed tools.
//!
//! Prints the Landlock ABI, whether seccomp filters and namespaces are available,
//! whether toolgate runs as root (then tools run as an unprivileged user), and for
//! each guarantee of a sandbox profile the mechanism that would hold it, or that none
//! would (calls of tools asking for it are then refused with `sandbox_unavailable`).
//! Exit 0 when the default profile can be enforced, 1 when it cannot.

use clap::Args;

use super::{Exit, Format};
use crate::sandbox::Host;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

pub fn doctor_command(args: &DoctorArgs) -> Exit {
    let host = Host::probe();
    let ok = host.default_profile_enforceable();
    match args.format {
        Format::Json => {
            let value = serde_json::json!({
                "default_profile_enforceable": ok,
                "host": host,
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&value).unwrap_or_default()
            );
        }
        Format::Text => {
            println!("landlock abi: {}", host.landlock_abi);
            println!("seccomp: {}", yes(host.seccomp));
            println!("namespaces: {}", yes(host.namespaces));
            println!(
                "running as root: {}{}",
                yes(host.root),
                if host.root {
                    " (tools run as an unprivileged uid, capabilities dropped)"
                } else {
                    ""
                }
            );
            for (guarantee, mechanism) in &host.guarantees {
                match mechanism {
                    Some(m) => println!("  {guarantee}: {m}"),
                    None => println!(
                        "  {guarantee}: UNAVAILABLE (calls needing it are refused: sandbox_unavailable)"
                    ),
                }
            }
            println!(
                "default profile: {}",
                if ok { "enforceable" } else { "NOT enforceable" }
            );
        }
    }
    if ok { Exit::Ok } else { Exit::Failure }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
