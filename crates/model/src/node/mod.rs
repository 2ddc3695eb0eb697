//! What the agent found of this node, as values: where the driver and gridd run (this host,
//! or a GPU Operator's driver container) and so whether the agent manages or only observes,
//! and the settings that follow from it. No I/O: the agent's `node` looks at the machine.

pub mod condition;
pub mod writer;

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
    /// The operator's markers are there but not its driver's readiness: the driver pod is
    /// going (its marker goes first) or not ready yet. Its token is no verdict meanwhile.
    pub pod_going: bool,
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
            pod_going: false,
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
            pod_going: self.pod_going,
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

/// What the GPU Operator's licensing Secret (`kubernetes.licensing_secret`) held when last
/// read.
#[derive(Debug, Clone, PartialEq)]
pub enum SecretToken {
    /// Its `client_configuration_token.tok`, decoded, or why it does not decode.
    Token(Box<Result<crate::token::Token, crate::token::TokenError>>),
    /// It holds no `client_configuration_token.tok`.
    NoToken,
}

/// The key of the token in the licensing Secret, as the GPU Operator reads it.
pub const SECRET_TOKEN_KEY: &str = "client_configuration_token.tok";

/// Two tokens, each named by what tells it from the other: its DLS, its DLS instance, its
/// id, its dates (those that differ; the dates where nothing else does).
fn apart(a: &crate::token::Token, b: &crate::token::Token) -> (String, String) {
    use crate::token::Token;
    let at = |d: Option<chrono::DateTime<chrono::Utc>>| {
        d.map_or_else(|| "?".to_string(), crate::time::rfc3339)
    };
    let dls = |t: &Token| {
        let hosts: Vec<&str> = t.nodes.iter().map(|n| n.host.as_str()).collect();
        format!("DLS {}", crate::text::escape(&hosts.join(", ")))
    };
    let text = |label: &str, v: &Option<String>| {
        format!(
            "{label} {}",
            crate::text::escape(v.as_deref().unwrap_or("?"))
        )
    };
    let facts: [&dyn Fn(&Token) -> String; 5] = [
        &dls,
        &|t| text("instance", &t.instance_ref),
        &|t| text("id", &t.token_id),
        &|t| format!("issued {}", at(t.issued_at)),
        &|t| format!("expires {}", at(t.expires)),
    ];
    let differing: Vec<_> = facts.iter().filter(|f| f(a) != f(b)).collect();
    let shown = |t: &Token| -> String {
        if differing.is_empty() {
            return format!("issued {}, expires {}", at(t.issued_at), at(t.expires));
        }
        differing
            .iter()
            .map(|f| f(t))
            .collect::<Vec<_>>()
            .join(", ")
    };
    (shown(a), shown(b))
}

/// Why the token gridd runs with is not the one in the licensing Secret `secret` (named
/// `name`), which only a new driver pod would copy in: `None` where they agree, or where
/// gridd runs with no valid token (that is said as the token's own failure).
pub fn stale(
    name: &crate::config::SecretRef,
    secret: &SecretToken,
    installed: Option<&crate::token::Token>,
) -> Option<String> {
    let installed = installed?;
    Some(match secret {
        SecretToken::Token(read) => match read.as_ref() {
            Ok(t) if t == installed => return None,
            Ok(t) => {
                let (theirs, ours) = apart(t, installed);
                format!(
                    "the licensing Secret {name} holds another token ({theirs}) than the one gridd runs with ({ours}): the driver pod copies the Secret only when it starts"
                )
            }
            Err(e) => format!(
                "the licensing Secret {name} holds a {SECRET_TOKEN_KEY} that is not a valid token ({e}): a new driver pod would start with it and get no license"
            ),
        },
        SecretToken::NoToken => format!(
            "the licensing Secret {name} holds no {SECRET_TOKEN_KEY}: a new driver pod would start without a token"
        ),
    })
}
