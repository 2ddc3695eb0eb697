//! What the agent found of this node, as values: where the driver and gridd run (this host,
//! or a GPU Operator's driver container) and so whether the agent manages or only observes,
//! and the settings that follow from it. No I/O: [`crate::node`] looks at the machine.

use std::path::{Path, PathBuf};

use crate::config::Settings;

/// What the agent does on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// It installs the token, edits gridd.conf and restarts gridd.
    Manage,
    /// It only reads.
    Observe,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Manage => "manage",
            Mode::Observe => "observe",
        }
    }
}

/// This node as the agent found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub mode: Mode,
    /// The GPU Operator's driver root, on such a node.
    pub driver_root: Option<PathBuf>,
    /// `service.mode = "manage"` on a GPU Operator node: refused, observed instead.
    pub manage_refused: bool,
    /// The operator's marker says its driver container is ready (GPU Operator nodes).
    pub driver_ready: bool,
    /// This node's name, for the advice's `kubectl` commands (GPU Operator nodes).
    pub node_name: Option<String>,
}

impl Default for Node {
    /// A plain guest, managed: what the agent assumes before it has looked.
    fn default() -> Node {
        Node {
            mode: Mode::Manage,
            driver_root: None,
            manage_refused: false,
            driver_ready: false,
            node_name: None,
        }
    }
}

impl Node {
    /// What the report is told of the node.
    pub fn seen(&self) -> crate::state::NodeSeen {
        crate::state::NodeSeen {
            observe: self.mode == Mode::Observe,
            driver_root: self.driver_root.as_ref().map(|r| r.display().to_string()),
            driver_ready: self.driver_ready,
            node_name: self.node_name.clone(),
            manage_refused: self.manage_refused,
        }
    }

    /// The label of the info metric: where the driver comes from.
    pub fn driver(&self) -> &'static str {
        if self.driver_root.is_some() {
            "gpu_operator"
        } else {
            "host"
        }
    }

    /// The settings the agent works with on this node: on a GPU Operator node, the token
    /// and gridd.conf under the driver root and nvidia-smi run inside it.
    pub fn apply(&self, base: &Settings) -> Settings {
        let mut s = base.clone();
        if let Some(root) = &self.driver_root {
            s.paths.token_dir = under(root, &base.paths.token_dir);
            s.paths.gridd_conf = under(root, &base.paths.gridd_conf);
            s.commands.smi_root = Some(root.clone());
        }
        s
    }
}

/// `path` inside `root`.
pub fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}
