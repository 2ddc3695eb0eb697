//! The record that an image was prepared (`prepare-image`), kept beside the state directory,
//! and the service's reading of it: whether the journal's previous boot is the builder's.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::files::input::{self, Links};
use crate::model::config::Settings;

/// The record that an image was prepared, beside the state directory (the state directory
/// itself is emptied, and holds only the agent's own files).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImagePrepared {
    /// When `prepare-image` ran (RFC 3339).
    pub at: String,
    /// The boot it ran in (`/proc/sys/kernel/random/boot_id`); `None` for `--root` (the
    /// image was not booted then).
    pub boot_id: Option<String>,
}

/// Where the record is kept: `<state_dir>.image-prepared.json`.
pub fn marker_path(state_dir: &Path) -> PathBuf {
    let mut name = state_dir.file_name().unwrap_or_default().to_os_string();
    name.push(".image-prepared.json");
    state_dir.with_file_name(name)
}

impl ImagePrepared {
    pub fn read(state_dir: &Path) -> Option<ImagePrepared> {
        input::read_file(&marker_path(state_dir), 4096, Links::Refuse)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }

    /// Whether a previous boot (its id, and the time of its last journal entry) is the one
    /// the image was prepared in, or one before it: the builder's, not this guest's.
    pub fn covers(&self, boot_id: Option<&str>, last_entry: Option<DateTime<Utc>>) -> bool {
        let norm = |s: &str| s.trim().replace('-', "").to_ascii_lowercase();
        if let (Some(mine), Some(theirs)) = (&self.boot_id, boot_id)
            && norm(mine) == norm(theirs)
        {
            return true;
        }
        // A boot that ended before the image was prepared is the builder's too (the clone's
        // previous boot in a journal the image kept can be any of the builder's boots).
        let at = DateTime::parse_from_rfc3339(&self.at).map(|t| t.with_timezone(&Utc));
        matches!((at, last_entry), (Ok(at), Some(last)) if last <= at)
    }
}

/// What gridd did with its lease as this guest's previous boot ended
/// ([`crate::observe::live::previous_boot_shutdown`]); none on a clone's first boot, whose
/// previous boot in the journal the image kept is the builder's.
pub fn last_shutdown(settings: &Settings) -> Option<crate::model::shutdown::LastShutdown> {
    if previous_boot_is_the_builders(settings) {
        return None;
    }
    crate::observe::live::previous_boot_shutdown(settings)
}

/// For the service's last-shutdown reading: whether the journal's previous boot is the
/// builder's (the image was prepared in it, or after it), so that it is not reported as this
/// guest's own. Asks journalctl for that boot's last entry only when the image was prepared.
pub fn previous_boot_is_the_builders(settings: &Settings) -> bool {
    let Some(marker) = ImagePrepared::read(&settings.paths.state_dir) else {
        return false;
    };
    let argv: Vec<String> = [
        settings.commands.journalctl.as_str(),
        "--boot=-1",
        "--lines=1",
        "--output=json",
        "--no-pager",
    ]
    .map(String::from)
    .to_vec();
    let Ok(out) = crate::gridd::command::run(&argv, settings.commands.timeout) else {
        return false;
    };
    let Some(entry) = String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    else {
        // No previous boot in the journal: nothing of the builder's to report either.
        return false;
    };
    let boot_id = entry["_BOOT_ID"].as_str();
    let last = entry["__REALTIME_TIMESTAMP"]
        .as_str()
        .and_then(|s| s.parse::<i64>().ok())
        .and_then(DateTime::from_timestamp_micros);
    marker.covers(boot_id, last)
}
