//! The gateway benchmark: `cargo bench --bench gateway` builds toolgate optimized and
//! runs `toolgate-bench` (see src/bin/toolgate-bench/), which starts the real server and measures
//! the same tool call made directly and through the gateway. Arguments after `--` go
//! to `toolgate-bench` (e.g. `cargo bench --bench gateway -- --seconds 5`); the JSON
//! report goes to target/bench/gateway.json.

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    // cargo passes `--bench` to bench targets; everything else is for toolgate-bench.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench/gateway.json");
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate-bench"));
    if !args.iter().any(|a| a == "--out" || a.starts_with("--out=")) {
        command.args(["--out", out]);
    }
    match command.args(&args).status() {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: cannot run toolgate-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
