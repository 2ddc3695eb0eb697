//! Which boot of the journal is this one, for `journalctl`'s `--boot`: the kernel's, except in
//! a container, where journald stamps the container's own boot ID.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use tracing::warn;

use crate::gridd::command;
use crate::model::config::Settings;

/// Where systemd (pid 1) says it runs in a container, and which one.
const CONTAINER_FILE: &str = "/run/systemd/container";

/// The most the lookup may take: it runs before the service is ready.
const LOOKUP_LIMIT: Duration = Duration::from_secs(5);

/// `journalctl`'s selection of this boot's entries.
///
/// `--boot` means the kernel's boot ID. In a container (systemd-nspawn, LXC) journald stamps
/// the container's own boot ID instead, which the container manager lays over
/// `/proc/sys/kernel/random/boot_id`; the agent's sandbox (ProtectProc=,
/// ProtectKernelTunables=) mounts /proc anew and sees the kernel's, so `--boot` would match
/// none of this boot's entries, and the agent would follow nothing. There this boot is the
/// boot of this service's own start in the journal (systemd logs "Starting ..." with the
/// unit's invocation ID before it runs the agent), or else of the journal's newest entry,
/// named by its ID.
/// Looked up once per process; in a VM, no lookup at all.
///
/// (The previous boot needs none of this: `--boot=-1`, an offset without an ID, counts from
/// the journal's end.)
pub fn this_boot_arg(settings: &Settings) -> String {
    if !Path::new(CONTAINER_FILE).exists() {
        return "--boot".into();
    }
    static LOOKED_UP: OnceLock<Option<String>> = OnceLock::new();
    let id = LOOKED_UP.get_or_init(|| {
        let invocation = std::env::var("INVOCATION_ID").ok().filter(|i| is_id(i));
        let found = invocation
            .and_then(|i| {
                journal_boot(
                    settings,
                    &[
                        format!("INVOCATION_ID={i}"),
                        "+".into(),
                        format!("_SYSTEMD_INVOCATION_ID={i}"),
                    ],
                )
            })
            .or_else(|| journal_boot(settings, &[]));
        if found.is_none() {
            warn!(
                "in a container, and journalctl named no boot of this journal: gridd's lines are looked for under the kernel's boot ID, which journald may not use here"
            );
        }
        found
    });
    id.as_deref()
        .map_or_else(|| "--boot".into(), |id| format!("--boot={id}"))
}

fn is_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The `_BOOT_ID` of the newest entry that `matches` select (any entry without matches).
fn journal_boot(settings: &Settings, matches: &[String]) -> Option<String> {
    let mut argv: Vec<String> = [
        settings.commands.journalctl.as_str(),
        "--lines=1",
        "--output=json",
        "--output-fields=_BOOT_ID",
        "--no-pager",
        "--quiet",
    ]
    .map(String::from)
    .to_vec();
    argv.extend_from_slice(matches);
    let out = command::run(&argv, settings.commands.timeout.min(LOOKUP_LIMIT)).ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let entry: serde_json::Value = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())?;
    let id = entry["_BOOT_ID"].as_str()?;
    is_id(id).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_entrys_boot_is_read_from_journalctl() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("journalctl");
        let put = |body: &str| {
            crate::files::fsutil::write_test_program(&script, &format!("#!/bin/sh\n{body}\n"))
        };
        let mut settings = Settings::default();
        settings.commands.journalctl = script.display().to_string();
        // What journalctl prints for `--lines=1 --output=json --output-fields=_BOOT_ID`; the
        // matches come last.
        put(
            r#"[ "$6" = "INVOCATION_ID=0123456789abcdef0123456789abcdef" ] || exit 1
echo '{"__CURSOR":"s=1","_BOOT_ID":"303e9b0d25e14bfa9a445e30b6fd10ac"}'"#,
        );
        let invocation = [
            "INVOCATION_ID=0123456789abcdef0123456789abcdef".to_string(),
            "+".into(),
            "_SYSTEMD_INVOCATION_ID=0123456789abcdef0123456789abcdef".into(),
        ];
        assert_eq!(
            journal_boot(&settings, &invocation).as_deref(),
            Some("303e9b0d25e14bfa9a445e30b6fd10ac")
        );
        assert_eq!(journal_boot(&settings, &[]), None);
        // Anything but a boot ID is none.
        put(r#"echo '{"_BOOT_ID":"../x"}'"#);
        assert_eq!(journal_boot(&settings, &[]), None);
        put("exit 1");
        assert_eq!(journal_boot(&settings, &[]), None);
    }
}
