//! The `toolgate` binary: parses the command line and runs the command.

fn main() -> std::process::ExitCode {
    toolgate::cli::main()
}
