//! The agent's files in its state directory (`paths.state_dir`): their names, which entries
//! belong there, and the refusal of a directory that is not the agent's own. Used by
//! `install`, the boot-time identity check and `prepare-image`.

use std::fs;

use anyhow::anyhow;

use crate::files::fsutil;
use crate::model::config::Settings;
use crate::model::text::show_path;

/// Held while an install runs.
pub const LOCK_FILE: &str = "install.lock";
/// What the last install left owed (a restart, a retry).
pub const STATE_FILE: &str = "install-state.json";
/// The recorded identity.
pub const IDENTITY_FILE: &str = "identity.json";
/// A clone found at boot, waiting for the service to report it.
pub const CLONE_FILE: &str = "clone-detected.json";
/// The same, once the service has reported it.
pub const CLONE_SEEN_FILE: &str = "clone-detected.seen.json";
/// Held by the running service (`run`), with its pid: one agent per guest.
pub const RUN_LOCK_FILE: &str = "run.lock";
/// The service's restarts of gridd in the last hour, for its next run in the same boot.
pub const RESTARTS_FILE: &str = "restarts.json";
/// The directory of files moved aside, one `<stamp>` directory per install.
pub const REPLACED_DIR: &str = "replaced";
/// The form of a `replaced/<stamp>` directory's name (UTC, `chrono` format).
pub const STAMP_FORMAT: &str = "%Y%m%dT%H%M%SZ";

/// Whether `name` belongs in the agent's state directory.
pub fn expected_in_state_dir(name: &str, m: &fs::Metadata) -> bool {
    ([
        LOCK_FILE,
        STATE_FILE,
        IDENTITY_FILE,
        CLONE_FILE,
        CLONE_SEEN_FILE,
        RUN_LOCK_FILE,
        RESTARTS_FILE,
    ]
    .contains(&name)
        && m.is_file())
        || (name == REPLACED_DIR && m.is_dir())
        || fsutil::is_temp_name(name)
}

/// Refuses a state directory that is not the agent's own.
pub fn check_state_dir(settings: &Settings) -> anyhow::Result<()> {
    let dir = &settings.paths.state_dir;
    crate::files::dir::managed_entries(dir, expected_in_state_dir)
        .map(drop)
        .map_err(|e| {
            anyhow!(
                "the state directory {} (paths.state_dir) {e}; nothing was changed",
                show_path(dir),
            )
        })
}
