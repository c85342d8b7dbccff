//! The demo policy (`policy/` and `tools/` of the repository) copied into a test's
//! directory and edited there, one exact text edit at a time: the one way the tests
//! derive a policy from the demo.

use std::path::{Path, PathBuf};

use super::{Start, copy_dir, repo};

/// A copy of the demo policy under `root`: `root/policy` and `root/tools`.
pub struct Demo {
    pub root: PathBuf,
    /// The copy's `policy/` (roles.yaml, lanes.yaml, tests/).
    pub policy: PathBuf,
    /// The copy's `tools/` (the registry and the demo tools' programs and data).
    pub tools: PathBuf,
    /// The copy's `tools/tool_registry.yaml`.
    pub registry: PathBuf,
}

impl Demo {
    /// Copies the demo policy and tools into `root` (created if missing).
    pub fn copy_into(root: &Path) -> Demo {
        let (policy, tools) = (root.join("policy"), root.join("tools"));
        copy_dir(&repo().join("policy"), &policy);
        copy_dir(&repo().join("tools"), &tools);
        Demo {
            root: root.to_path_buf(),
            registry: tools.join("tool_registry.yaml"),
            policy,
            tools,
        }
    }

    /// A file of the copy by its path under `root` (`policy/roles.yaml`,
    /// `tools/tool_registry.yaml`).
    pub fn file(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Replaces `from` by `to` in the file at `rel`, which must hold `from` exactly
    /// once: an edit that silently misses (the demo changed) fails the test.
    pub fn edit(&self, rel: &str, from: &str, to: &str) -> &Demo {
        edit(&self.file(rel), from, to);
        self
    }

    /// Replaces every `from` by `to` in the file at `rel`, which must hold it.
    pub fn edit_all(&self, rel: &str, from: &str, to: &str) -> &Demo {
        let path = self.file(rel);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "`{from}` is not in {}", path.display());
        std::fs::write(&path, text.replace(from, to)).unwrap();
        self
    }

    /// How to start a server on the copy, its data directory `root/var`.
    pub fn start(&self) -> Start {
        Start {
            policy_dir: self.policy.clone(),
            tools: self.registry.clone(),
            data_dir: Some(self.root.join("var")),
            ..Start::default()
        }
    }
}

/// Replaces `from` by `to` in `file`, which must hold `from` exactly once.
pub fn edit(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    assert_eq!(
        text.matches(from).count(),
        1,
        "`{from}` must be in {} exactly once",
        file.display()
    );
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
}
