//! Which boot of the journal is this one, for `journalctl`'s `--boot`: the kernel's, except in
//! a container, where journald stamps the container's own boot ID.

use std::fs;
use std::path::Path;

use crate::command;
use crate::config::Settings;

/// Where systemd (pid 1) says it runs in a container, and which one.
const CONTAINER_FILE: &str = "/run/systemd/container";

/// `journalctl`'s boot selection for this boot (`offset` 0) or one before it (-1).
///
/// `--boot` means the kernel's boot ID. In a container (systemd-nspawn, LXC) journald stamps
/// the container's own boot ID instead, which the container manager lays over
/// `/proc/sys/kernel/random/boot_id`; the agent's sandbox (ProtectProc=,
/// ProtectKernelTunables=) mounts /proc anew and sees the kernel's, so `--boot` would match
/// none of this boot's entries, and the agent would follow nothing. There this boot is
/// the boot of the journal's newest entry (journald and the agent itself log in it).
pub fn boot_arg(settings: &Settings, offset: i32) -> String {
    if !Path::new(CONTAINER_FILE).exists() {
        return boot_relative_to(None, offset);
    }
    let kernel = fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().replace('-', ""))
        .unwrap_or_default();
    let journal = newest_entry_boot(settings).filter(|id| *id != kernel);
    boot_relative_to(journal.as_deref(), offset)
}

/// `--boot` for the kernel's boot (`id` `None`) or for the boot `id`, `offset` boots back.
fn boot_relative_to(id: Option<&str>, offset: i32) -> String {
    match (id, offset) {
        (None, 0) => "--boot".into(),
        (None, n) => format!("--boot={n}"),
        (Some(id), 0) => format!("--boot={id}"),
        (Some(id), n) => format!("--boot={id}{n:+}"),
    }
}

/// The `_BOOT_ID` of the journal's newest entry.
fn newest_entry_boot(settings: &Settings) -> Option<String> {
    let argv: Vec<String> = [
        settings.commands.journalctl.as_str(),
        "--lines=1",
        "--output=json",
        "--output-fields=_BOOT_ID",
        "--no-pager",
        "--quiet",
    ]
    .map(String::from)
    .to_vec();
    let out = command::run(&argv, settings.commands.timeout).ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let entry: serde_json::Value = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())?;
    let id = entry["_BOOT_ID"].as_str()?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boot_is_selected_by_the_journals_id_where_the_kernels_is_not_its() {
        assert_eq!(boot_relative_to(None, 0), "--boot");
        assert_eq!(boot_relative_to(None, -1), "--boot=-1");
        let id = "303e9b0d25e14bfa9a445e30b6fd10ac";
        assert_eq!(boot_relative_to(Some(id), 0), format!("--boot={id}"));
        assert_eq!(boot_relative_to(Some(id), -1), format!("--boot={id}-1"));
    }

    #[test]
    fn the_newest_entrys_boot_is_read_from_journalctl() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("journalctl");
        // Installed by another process: a file this one had open for writing may be held by
        // a child another test thread forks meanwhile, and would not run (ETXTBSY).
        let put = |body: &str| {
            let src = dir.path().join("src");
            fs::write(&src, format!("#!/bin/sh\n{body}\n")).unwrap();
            let ok = std::process::Command::new("install")
                .arg("-m0755")
                .arg(&src)
                .arg(&script)
                .status()
                .unwrap();
            assert!(ok.success());
        };
        let mut settings = Settings::default();
        settings.commands.journalctl = script.display().to_string();
        // What journalctl prints for `--lines=1 --output=json --output-fields=_BOOT_ID`.
        put(r#"echo '{"__CURSOR":"s=1","_BOOT_ID":"303e9b0d25e14bfa9a445e30b6fd10ac"}'"#);
        assert_eq!(
            newest_entry_boot(&settings).as_deref(),
            Some("303e9b0d25e14bfa9a445e30b6fd10ac")
        );
        // Anything but a boot ID is none.
        put(r#"echo '{"_BOOT_ID":"../x"}'"#);
        assert_eq!(newest_entry_boot(&settings), None);
        put("exit 1");
        assert_eq!(newest_entry_boot(&settings), None);
    }
}
