//! `toolgate audit fleet-key`, and `audit verify` and `audit export` on the audit hub
//! (`--cluster-db`): flags, command bodies, output and exit codes of the fleet side.

use std::path::{Path, PathBuf};

use clap::Args;

use super::audit::VerifyArgs;
use super::print_error;
use crate::commands::{Exit, Format};

/// Prints a line to stdout; a closed pipe (`| head`) is not an error worth a panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

#[derive(Debug, Args)]
pub struct FleetKeyArgs {
    /// The directory of the fleet key (created, mode 0700, with a new key if it holds
    /// none). Put its `audit-signing.key` in one secret mounted in every sidecar.
    #[arg(long)]
    pub key_dir: PathBuf,
    /// The name of a new key.
    #[arg(long, default_value = crate::hub::FLEET_ORIGIN)]
    pub name: String,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

/// `audit fleet-key --key-dir DIR`: loads the fleet key in DIR, or makes one.
pub(super) fn fleet_key_command(args: &FleetKeyArgs) -> Exit {
    use crate::audit::keys::{SIGNING_KEY_FILE, check_private, create_signer, load_signer};
    let key = if args.key_dir.join(SIGNING_KEY_FILE).exists() {
        load_signer(&args.key_dir)
    } else {
        create_signer(&args.key_dir, &args.name)
    };
    match key.and_then(|key| check_private(&args.key_dir).map(|()| key)) {
        Ok(key) => {
            let key = key.verifier;
            match args.format {
                Format::Json => say!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "key_dir": args.key_dir.display().to_string(),
                        "key_name": key.name,
                        "fingerprint": key.fingerprint(),
                        "vkey": key.to_vkey(),
                    }))
                    .unwrap_or_default()
                ),
                Format::Text => {
                    say!("fleet key name: {}", key.name);
                    say!("fingerprint: {}", key.fingerprint());
                    say!("verifier key: {}", key.to_vkey());
                }
            }
            Exit::Ok
        }
        Err(error) => {
            print_error(&error, error.help());
            Exit::Signature
        }
    }
}

/// The exit code of a fleet verify or export failure.
fn exit_for_fleet(error: &crate::hub::fleet::FleetError) -> Exit {
    use crate::hub::fleet::FleetError;
    match error {
        FleetError::Hub(crate::hub::HubError::FleetKey { .. }) => Exit::Signature,
        FleetError::Hub(_) | FleetError::Output(_) => Exit::InvalidConfig,
        FleetError::Witness(_) => Exit::Signature,
        FleetError::Problem(p) => match p.kind.exit_code() {
            2 => Exit::Truncated,
            3 => Exit::Signature,
            _ => Exit::Failure,
        },
    }
}

/// Prints a fleet failure: JSON on stdout with `--format json`, else one line.
fn print_fleet_error(error: &crate::hub::fleet::FleetError, format: Format) {
    use crate::hub::fleet::{FleetError, error_json};
    match (format, error) {
        (Format::Json, _) => say!(
            "{}",
            serde_json::to_string_pretty(&error_json(error)).unwrap_or_default()
        ),
        (Format::Text, FleetError::Problem(p)) => say!("FAILED: {p}"),
        (Format::Text, FleetError::Hub(e)) => print_error(e, Some("check --cluster-db URL")),
        (Format::Text, FleetError::Output(m)) => print_error(m, None),
        (Format::Text, FleetError::Witness(m)) => say!("FAILED: witness: {m}"),
    }
}

/// `audit verify --cluster-db URL`.
pub(super) fn fleet_verify_command(url: &str, args: &VerifyArgs) -> Exit {
    let (pin, format) = (args.fleet_key_fingerprint.as_deref(), args.format);
    let quorum = args.quorum.unwrap_or(args.witness_keys.len());
    if !args.witness_keys.is_empty() && (quorum == 0 || quorum > args.witness_keys.len()) {
        print_error(
            &format!(
                "--quorum {quorum} must be between 1 and the {} witness keys given",
                args.witness_keys.len()
            ),
            None,
        );
        return Exit::InvalidConfig;
    }
    let witnesses =
        (!args.witness_keys.is_empty()).then_some((args.witness_keys.as_slice(), quorum));
    let runtime = match crate::commands::runtime(&mut tokio::runtime::Builder::new_current_thread())
    {
        Ok(runtime) => runtime,
        Err(exit) => return exit,
    };
    let result = runtime.block_on(async {
        let pool = crate::hub::connect(url).await?;
        crate::hub::fleet::verify(&pool, pin, witnesses).await
    });
    match result {
        Ok(report) => {
            match format {
                Format::Json => {
                    let mut value = serde_json::to_value(&report).unwrap_or_default();
                    value["status"] = "ok".into();
                    say!(
                        "{}",
                        serde_json::to_string_pretty(&value).unwrap_or_default()
                    );
                }
                Format::Text => {
                    for s in &report.sidecars {
                        say!(
                            "ok: sidecar {}: {} events, {} checkpoints, key fingerprint {}",
                            s.origin,
                            s.events,
                            s.checkpoints,
                            s.key_fingerprint
                        );
                    }
                    say!(
                        "ok: fleet log: {} checkpoints, root {}",
                        report.fleet_size,
                        report.fleet_root
                    );
                    match (&report.fleet_key_fingerprint, report.fleet_key_confirmed) {
                        (Some(f), true) => say!("fleet key fingerprint {f} (as given)"),
                        (Some(f), false) => say!(
                            "fleet key fingerprint {f} (NOT confirmed: pass --fleet-key-fingerprint)"
                        ),
                        (None, _) => say!("no fleet key bound yet (the fleet log is empty)"),
                    }
                    if let Some(w) = &report.witnesses {
                        say!(
                            "witnessed: fleet size {} cosigned by {} of {} witnesses",
                            w.witnessed_size.unwrap_or(0),
                            w.quorum,
                            w.witnesses.len()
                        );
                        for (name, cosigned) in &w.witnesses {
                            match cosigned {
                                Some(s) => say!("witness {name}: cosigned up to fleet size {s}"),
                                None => say!("witness {name}: cosigned nothing"),
                            }
                        }
                    }
                }
            }
            Exit::Ok
        }
        Err(error) => {
            print_fleet_error(&error, format);
            exit_for_fleet(&error)
        }
    }
}

/// `audit export --cluster-db URL --run RUN_ID --out DIR`.
pub(super) fn fleet_export_command(
    url: &str,
    run: &str,
    out: &Path,
    key_dir: Option<&Path>,
) -> Exit {
    let key_dir = key_dir.map(Path::to_path_buf).or_else(|| {
        std::env::var_os("TOOLGATE_FLEET_KEY_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    });
    let Some(key_dir) = key_dir else {
        say!(
            "{}",
            serde_json::json!({
                "status": "failed",
                "error": "fleet_key_missing",
                "message": "a fleet export's manifest is signed with the fleet key: give --fleet-key-dir DIR (or TOOLGATE_FLEET_KEY_DIR)",
            })
        );
        return Exit::InvalidConfig;
    };
    let fleet_key = match crate::audit::keys::check_private(&key_dir)
        .and_then(|()| crate::audit::keys::load_signer(&key_dir))
    {
        Ok(key) => key,
        Err(e) => {
            say!(
                "{}",
                serde_json::json!({
                    "status": "failed",
                    "error": "fleet_key_invalid",
                    "message": format!("refusing the fleet key directory: {e}"),
                })
            );
            return Exit::Signature;
        }
    };
    let runtime = match crate::commands::runtime(&mut tokio::runtime::Builder::new_current_thread())
    {
        Ok(runtime) => runtime,
        Err(exit) => return exit,
    };
    let result = runtime.block_on(async {
        let pool = crate::hub::connect(url).await?;
        crate::hub::fleet::export(&pool, run, out, &fleet_key).await
    });
    match result {
        Ok(summary) => {
            say!(
                "{}",
                serde_json::to_string_pretty(&summary).unwrap_or_default()
            );
            Exit::Ok
        }
        Err(error) => {
            print_fleet_error(&error, Format::Json);
            exit_for_fleet(&error)
        }
    }
}
