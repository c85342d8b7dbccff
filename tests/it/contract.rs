//! The published contract files match the code: the diagnostic catalog in
//! contract/diagnostics.json is what the gateway really answers with.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::common::golden::Example;
use rstest::rstest;
use serde_json::Value;
use toolgate::diagnostic::Reason;
use toolgate::server::published_catalog as catalog_json;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn diagnostics_catalog_matches_the_code() {
    let path = repo().join("contract/diagnostics.json");
    let generated = serde_json::to_string_pretty(&catalog_json()).unwrap() + "\n";
    if std::env::var_os("TOOLGATE_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let published = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        published == generated,
        "contract/diagnostics.json is out of date; run `TOOLGATE_BLESS=1 cargo test --test it contract` and review the diff"
    );
}

#[test]
fn every_reason_has_a_unique_code_and_a_valid_step() {
    let mut seen = BTreeSet::new();
    for reason in Reason::ALL {
        assert!(
            seen.insert(reason.as_str()),
            "duplicate {}",
            reason.as_str()
        );
        let info = reason.info();
        assert!((1..=13).contains(&info.step), "{}", reason.as_str());
        assert!(!info.meaning.is_empty() && !info.suggested_fix.is_empty());
    }
}

/// One test per golden example: its diagnostic names a cataloged reason with that
/// reason's step and error code.
#[rstest]
fn golden_example_names_a_cataloged_reason_and_step(
    #[files("contract/examples/*.json")] path: PathBuf,
) {
    let catalog = catalog_json();
    let reasons: Vec<&Value> = catalog["reasons"].as_array().unwrap().iter().collect();
    let example = Example::read(&path);
    let Some(diagnostic) = example.diagnostic() else {
        assert_eq!(example.status(), "success", "{path:?}: no diagnostic");
        return;
    };
    let reason = diagnostic["reason"].as_str().unwrap();
    let entry = reasons
        .iter()
        .find(|r| r["reason"] == reason)
        .unwrap_or_else(|| panic!("{path:?}: reason `{reason}` is not in the catalog"));
    assert_eq!(entry["failed_step"], diagnostic["failed_step"], "{path:?}");
    assert_eq!(entry["error_code"], diagnostic["error_code"], "{path:?}");
}
