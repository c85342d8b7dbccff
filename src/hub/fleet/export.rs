//! `audit export --cluster-db`: one run's events from every sidecar with their
//! inclusion proofs, the fleet checkpoint they are cut at, and a manifest signed with
//! the fleet key (see docs/audit.md, "Fleet export").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Serialize;
use serde_json::{Value, json};

use super::{FLEET_MANIFEST_DOMAIN, FleetError, MAX_EXPORTED_COSIGNED, Verified, verify_all};
use crate::audit::keys::{SignerKey, VerifierKey};
use crate::audit::merkle::{Tree, leaf_hash};

/// What an export wrote.
#[derive(Debug, Clone, Serialize)]
pub struct FleetExportSummary {
    pub out_dir: String,
    pub run_id: String,
    pub fleet_size: u64,
    /// Whether the export holds every event of the run any sidecar the hub knows of
    /// holds (the manifest's `complete`); the warnings say what is missing.
    pub complete: bool,
    /// Per sidecar: its origin and the events written.
    pub sidecars: Vec<(String, u64)>,
    pub warnings: Vec<String>,
}

/// Writes one run's events from every sidecar with their proofs (see docs/audit.md,
/// "Fleet export").
///
/// The manifest is a signed statement of what the export covers: it lists, per
/// sidecar, every seq and leaf hash of the run up to the fleet checkpoint the export is
/// cut at, and is signed with the fleet key (`fleet_signer`, which must be the key the
/// hub is bound to) over [`FLEET_MANIFEST_DOMAIN`] followed by the bytes of
/// manifest.json (manifest.sig). It says `complete` only when no sidecar the hub knows
/// of holds events of the run the hub does not (`hub_unshipped`, see `tail`) and the
/// hub holds none above the cut; otherwise `unshipped` names the sidecars and the
/// warnings say what to do.
pub async fn export(
    pool: &deadpool_postgres::Pool,
    run_id: &str,
    out: &Path,
    fleet_signer: &SignerKey,
) -> Result<FleetExportSummary, FleetError> {
    let output = |e: std::io::Error| FleetError::Output(format!("`{}`: {e}", out.display()));
    if out.exists() && std::fs::read_dir(out).map_err(output)?.next().is_some() {
        return Err(FleetError::Output(format!(
            "the output directory `{}` is not empty",
            out.display()
        )));
    }
    let verified = verify_all(pool, true, None, Some(run_id)).await?;
    if let Some(bound) = &verified.fleet_key {
        crate::hub::fleet_key_matches(
            crate::hub::FLEET_ORIGIN,
            &bound.to_vkey(),
            &fleet_signer.verifier,
        )?;
    }
    let fleet_size = verified.report.fleet_size;
    let Some((_, _, _, fleet_note)) = verified.fleet.last() else {
        return Err(FleetError::Output(
            "the fleet log is empty: nothing was shipped".into(),
        ));
    };
    let fleet_tree = Tree::new(
        verified
            .fleet
            .iter()
            .map(|f| leaf_hash(f.2.as_bytes()))
            .collect(),
    );
    // Each sidecar's newest checkpoint in the fleet log.
    let mut newest: BTreeMap<String, (u64, u64, String)> = BTreeMap::new();
    for (i, (origin, size, leaf, _)) in verified.fleet.iter().enumerate() {
        newest.insert(origin.clone(), (i as u64, *size, leaf.clone()));
    }
    crate::localfile::create_dir_all(&out.join("sidecars")).map_err(output)?;
    let mut manifest_sidecars = Vec::new();
    // The sha256 of every file the manifest vouches for, by its path in the export.
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    let mut summary = Vec::new();
    let mut warnings = Vec::new();
    let mut above_cut = false;
    for (n, (origin, (leaf_index, size, note))) in newest.iter().enumerate() {
        let Some(rows) = verified.run_rows.get(origin).filter(|r| !r.is_empty()) else {
            continue;
        };
        let written = write_sidecar(
            out,
            &format!("sidecars/{:03}", n + 1),
            &verified,
            (origin, *leaf_index, *size, note),
            rows,
            &fleet_tree,
            &mut files,
        )?;
        above_cut |= !written.above_cut.is_empty();
        warnings.extend(written.above_cut);
        manifest_sidecars.push(written.manifest);
        let count = written.count;
        summary.push((origin.clone(), count));
    }
    // What the hub does not hold: the export says so instead of calling itself
    // complete.
    let unshipped = unshipped(&verified, run_id, &mut warnings);
    let complete = unshipped.is_empty() && !above_cut;
    write_hashed(out, "fleet-checkpoint.txt", fleet_note, &mut files)?;
    let cosigned_proofs = write_cosigned(pool, &verified, &fleet_tree, out, &mut files).await?;
    let manifest = json!({
        "format": "toolgate-fleet-export/1",
        "run_id": run_id,
        "complete": complete,
        "unshipped": unshipped,
        "fleet": {
            "size": fleet_size,
            "root": verified.report.fleet_root,
            "signer": verified.fleet_key.as_ref().map(|k| k.name.clone()),
            "signer_vkey": verified.fleet_key.as_ref().map(VerifierKey::to_vkey),
            "cosigned": cosigned_proofs,
        },
        "sidecars": manifest_sidecars,
        "files": files,
    });
    let manifest_text = serde_json::to_string_pretty(&manifest).unwrap_or_default() + "\n";
    let mut statement = FLEET_MANIFEST_DOMAIN.as_bytes().to_vec();
    statement.extend_from_slice(manifest_text.as_bytes());
    let mut signature = fleet_signer.verifier.key_id.to_vec();
    signature.extend_from_slice(&fleet_signer.sign(&statement));
    write(out, "manifest.json", &manifest_text)?;
    write(
        out,
        "manifest.sig",
        &format!(
            "{} {}\n",
            fleet_signer.verifier.name,
            base64::engine::general_purpose::STANDARD.encode(signature)
        ),
    )?;
    write(out, "verify_export.py", crate::audit::export::VERIFY_SCRIPT)?;
    Ok(FleetExportSummary {
        out_dir: out.display().to_string(),
        run_id: run_id.to_string(),
        fleet_size,
        complete,
        sidecars: summary,
        warnings,
    })
}

/// What one sidecar's part of an export holds.
struct SidecarWritten {
    /// Its entry in the manifest.
    manifest: Value,
    /// The run's events written.
    count: u64,
    /// A warning per event of the run above the fleet checkpoint the export is cut at.
    above_cut: Vec<String>,
}

/// Writes a sidecar's events of the run under `dir` with their inclusion proofs and
/// its checkpoint at the cut; `at` is (origin, fleet leaf index, size, note).
fn write_sidecar(
    out: &Path,
    dir: &str,
    verified: &Verified,
    at: (&String, u64, u64, &String),
    rows: &[(u64, String)],
    fleet_tree: &Tree,
    files: &mut BTreeMap<String, String>,
) -> Result<SidecarWritten, FleetError> {
    let (origin, leaf_index, size, note) = at;
    let fleet_size = verified.report.fleet_size;
    let output = |e: std::io::Error| FleetError::Output(format!("`{}`: {e}", out.display()));
    let mut above_cut = Vec::new();
    let leaves = verified.leaves.get(origin).cloned().unwrap_or_default();
    let tree = Tree::new(leaves);
    crate::localfile::create_dir_all(&out.join(dir)).map_err(output)?;
    let mut events = String::new();
    let mut proofs = String::new();
    let mut count = 0u64;
    let (mut seqs, mut hashes) = (Vec::new(), Vec::new());
    for (seq, line) in rows {
        let seq = *seq;
        if seq > size {
            above_cut.push(format!(
                "sidecar `{origin}` seq {seq} is not under a fleet checkpoint yet; not exported"
            ));
            continue;
        }
        let path = tree.inclusion_proof(seq - 1, size).unwrap_or_default();
        seqs.push(seq);
        hashes.push(crate::canonical::to_hex(leaf_hash(line.as_bytes())));
        events.push_str(line);
        events.push('\n');
        proofs.push_str(&json!({"seq": seq, "tree_size": size, "path": path.iter().map(hex::encode).collect::<Vec<_>>()}).to_string());
        proofs.push('\n');
        count += 1;
    }
    write_hashed(out, &format!("{dir}/events.jsonl"), &events, files)?;
    write_hashed(out, &format!("{dir}/proofs.jsonl"), &proofs, files)?;
    write_hashed(out, &format!("{dir}/checkpoint.txt"), note, files)?;
    let key = verified
        .keys
        .get(origin)
        .map(VerifierKey::to_vkey)
        .unwrap_or_default();
    let fleet_path = fleet_tree
        .inclusion_proof(leaf_index, fleet_size)
        .unwrap_or_default();
    let manifest = json!({
        "origin": origin,
        "dir": dir,
        "vkey": key,
        "events": count,
        "seqs": seqs,
        "leaf_hashes": hashes,
        "checkpoint_size": size,
        "fleet_leaf_index": leaf_index,
        "fleet_path": fleet_path.iter().map(hex::encode).collect::<Vec<_>>(),
    });
    Ok(SidecarWritten {
        manifest,
        count,
        above_cut,
    })
}

/// The sidecars holding events of the run the hub does not, each with a warning.
fn unshipped(verified: &Verified, run_id: &str, warnings: &mut Vec<String>) -> Vec<Value> {
    let hub_sizes: BTreeMap<&str, u64> = verified
        .report
        .sidecars
        .iter()
        .map(|s| (s.origin.as_str(), s.events))
        .collect();
    let mut unshipped = Vec::new();
    for (origin, since_seq) in &verified.unshipped {
        let hub_size = hub_sizes.get(origin.as_str()).copied().unwrap_or(0);
        warnings.push(format!(
        "sidecar `{origin}` holds events of run `{run_id}` that the hub does not (its seq {} on; the hub holds its log up to seq {hub_size}): this export is not complete; start that sidecar again with its data directory so that it ships them, then export again",
        since_seq.max(&(hub_size + 1))
    ));
        unshipped.push(json!({
            "origin": origin,
            "since_seq": since_seq,
            "hub_size": hub_size,
        }));
    }
    unshipped
}

/// Writes the cosigned fleet checkpoints (the newest ones); each with its consistency
/// proof to the exported fleet checkpoint, for the manifest.
async fn write_cosigned(
    pool: &deadpool_postgres::Pool,
    verified: &Verified,
    fleet_tree: &Tree,
    out: &Path,
    files: &mut BTreeMap<String, String>,
) -> Result<Vec<Value>, FleetError> {
    let fleet_size = verified.report.fleet_size;
    let notes: Vec<&str> = verified.fleet.iter().map(|f| f.3.as_str()).collect();
    let cosigned = crate::hub::witness::cosigned_notes(pool, &notes).await?;
    let cosigned = &cosigned[cosigned.len().saturating_sub(MAX_EXPORTED_COSIGNED)..];
    let mut cosigned_text = String::new();
    let mut cosigned_proofs = Vec::new();
    for (size, note) in cosigned {
        cosigned_text.push_str(note);
        cosigned_text.push('\n');
        let proof = fleet_tree
            .consistency_proof(*size, fleet_size)
            .unwrap_or_default();
        cosigned_proofs.push(json!({
            "size": size,
            "consistency": proof.iter().map(hex::encode).collect::<Vec<_>>(),
        }));
    }
    if !cosigned.is_empty() {
        write_hashed(out, "fleet-cosignatures.txt", &cosigned_text, files)?;
    }
    Ok(cosigned_proofs)
}

fn write(out: &Path, name: &str, text: &str) -> Result<(), FleetError> {
    let path: PathBuf = out.join(name);
    crate::localfile::write(&path, text.as_bytes())
        .map_err(|e| FleetError::Output(format!("`{}`: {e}", path.display())))
}

/// [`write`], recording the file's sha256 in `files` for the signed manifest.
fn write_hashed(
    out: &Path,
    name: &str,
    text: &str,
    files: &mut BTreeMap<String, String>,
) -> Result<(), FleetError> {
    write(out, name, text)?;
    let digest = crate::canonical::sha256_hex(text.as_bytes());
    files.insert(name.to_string(), digest);
    Ok(())
}
