//! The files in `packaging/` agree with the code: the default config is valid and shows the
//! real defaults, and the unit and tmpfiles.d entry name the directories the defaults use.

use std::path::Path;

use vgpu_license_agent::config::Settings;

const CONFIG: &str = include_str!("../packaging/config.toml");
const UNIT: &str = include_str!("../packaging/vgpu-license-agent.service");
const TMPFILES: &str = include_str!("../packaging/vgpu-license-agent.tmpfiles");

/// The config with every commented-out key (`#key = value`, no space after `#`) uncommented.
fn uncommented() -> String {
    CONFIG
        .lines()
        .map(|line| match line.strip_prefix('#') {
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_lowercase()) => rest,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn packaged_config_parses_and_changes_nothing() {
    let mut s = Settings::default();
    s.apply_toml(CONFIG).expect("packaging/config.toml");
    assert_eq!(s, Settings::default());
}

#[test]
fn packaged_config_comments_show_the_defaults() {
    let text = uncommented();
    let keys = text
        .lines()
        .filter(|l| l.contains(" = ") && !l.starts_with('#'))
        .count();
    assert!(keys >= 13, "only {keys} keys found uncommented:\n{text}");
    let mut s = Settings::default();
    s.apply_toml(&text)
        .unwrap_or_else(|e| panic!("uncommented packaging/config.toml: {e}"));
    // The one difference: feature_type set at all asks the service to keep it in place.
    assert!(s.gridd.feature_type_configured);
    s.gridd.feature_type_configured = false;
    assert_eq!(
        s,
        Settings::default(),
        "a commented value is not the default"
    );
}

fn unit_values(key: &str) -> Vec<&'static str> {
    UNIT.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .flat_map(str::split_whitespace)
        .collect()
}

#[test]
fn unit_and_tmpfiles_match_the_default_paths() {
    let d = Settings::default();
    assert_eq!(
        unit_values("ExecStart"),
        ["/usr/bin/vgpu-license-agent", "run"]
    );
    assert_eq!(unit_values("Type"), ["notify"]);

    let state = d.paths.state_dir.to_str().unwrap();
    let run = d.paths.status_file.parent().unwrap().to_str().unwrap();
    assert_eq!(state, "/var/lib/vgpu-license-agent");
    assert_eq!(unit_values("StateDirectory"), ["vgpu-license-agent"]);
    assert_eq!(run, "/run/vgpu-license-agent");
    assert_eq!(unit_values("RuntimeDirectory"), ["vgpu-license-agent"]);
    for dir in [state, run] {
        assert!(
            TMPFILES
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(dir)),
            "tmpfiles.d has no entry for {dir}"
        );
    }

    // Everything the agent writes outside its own directories is writable in the sandbox.
    let writable: Vec<&str> = unit_values("ReadWritePaths")
        .into_iter()
        .map(|p| p.trim_start_matches('-'))
        .collect();
    for path in [
        d.paths.token_dir.as_path(),
        d.paths.gridd_conf.as_path(),
        d.paths.metrics_textfile.as_path(),
    ] {
        assert!(
            writable.iter().any(|w| path.starts_with(Path::new(w))),
            "{} is not under ReadWritePaths= {writable:?}",
            path.display()
        );
    }
}
