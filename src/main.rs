//! The `toolgate` binary: parses the command line and runs the command.

/// mimalloc: the gateway allocates and frees many small objects per call on several
/// threads; glibc's malloc took about 12% of the server's CPU (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    toolgate::commands::main()
}
