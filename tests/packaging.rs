//! The files in `packaging/` agree with the code: the default config is valid and shows the
//! real defaults, and the unit and tmpfiles.d entry name the directories the defaults use.

use std::path::Path;

use vgpu_license_model::config::Settings;

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

const RELOAD_UNIT: &str = UNIT;
const WAIT_UNIT: &str = include_str!("../packaging/vgpu-license-agent-wait-licensed.service");
const TARGET: &str = include_str!("../packaging/vgpu-licensed.target");
const PRESET: &str = include_str!("../packaging/vgpu-license-agent.preset");
const INSTALL_MAP: &str = include_str!("../packaging/install-map.txt");

fn values_in(unit: &'static str, key: &str) -> Vec<&'static str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

#[test]
fn every_key_of_the_default_config_is_in_the_config_page() {
    let page = vgpu_license_agent::cli::manual::config_page(CONFIG, "", "vgpu-license-agent");
    let mut keys = Vec::new();
    for line in CONFIG.lines() {
        let kv = line.strip_prefix("# e.g. ").or_else(|| {
            line.strip_prefix('#')
                .filter(|r| r.starts_with(|c: char| c.is_ascii_lowercase()))
        });
        if let Some((key, _)) = kv.and_then(|kv| kv.split_once(" = ")) {
            keys.push(key.trim().to_string());
        }
    }
    assert!(keys.len() >= 25, "only {} keys found: {keys:?}", keys.len());
    for key in &keys {
        let shown = format!("\\fB{}\\fR", vgpu_license_agent::cli::manual::roff(key));
        assert!(
            page.lines().any(|l| l.starts_with(&shown)),
            "{key} is not described in vgpu-license-agent.toml(5)"
        );
    }
    // The uncommented keys are a config the agent takes: the page names no key it refuses.
    let mut s = Settings::default();
    s.apply_toml(&uncommented()).unwrap();
}

#[test]
fn reload_checks_the_config_before_it_signals() {
    assert_eq!(
        values_in(RELOAD_UNIT, "ExecReload"),
        // One command that checks and, only if the config is good, signals: no `kill` from
        // procps, which a minimal guest does not have.
        ["/usr/bin/vgpu-license-agent config check --reload $MAINPID"]
    );
}

#[test]
fn the_licensed_target_waits_through_the_oneshot_and_holds_no_boot() {
    assert_eq!(values_in(WAIT_UNIT, "Type"), ["oneshot"]);
    assert_eq!(values_in(WAIT_UNIT, "RemainAfterExit"), ["yes"]);
    assert_eq!(
        values_in(WAIT_UNIT, "ExecStart"),
        [
            "/usr/bin/vgpu-license-agent status --wait ${VGPU_LICENSE_WAIT_SECONDS} --require-licensed"
        ]
    );
    assert_eq!(
        values_in(WAIT_UNIT, "Environment"),
        ["VGPU_LICENSE_WAIT_SECONDS=600"]
    );
    // The wait's own limit is what ends it, never systemd's start timeout.
    assert_eq!(values_in(WAIT_UNIT, "TimeoutStartSec"), ["infinity"]);
    assert_eq!(
        values_in(TARGET, "Requires"),
        ["vgpu-license-agent-wait-licensed.service"]
    );
    assert_eq!(
        values_in(TARGET, "After"),
        ["vgpu-license-agent-wait-licensed.service"]
    );
    // Nothing in the default boot wants either: no [Install], no preset, and the agent's own
    // unit neither wants nor waits for them.
    for unit in [WAIT_UNIT, TARGET] {
        assert!(!unit.contains("[Install]"), "{unit}");
        assert!(values_in(unit, "Wants").is_empty() && values_in(unit, "WantedBy").is_empty());
    }
    assert!(!PRESET.contains("licensed"), "{PRESET}");
    assert!(!UNIT.contains("licensed.target"));
    // The oneshot reads the agent's report: it comes after the agent, without pulling it in.
    assert_eq!(
        values_in(WAIT_UNIT, "After"),
        ["vgpu-license-agent.service"]
    );
}

/// Runs packaging/install.sh as deb/build.sh and rpm/build.sh do, from a stand-in of what
/// build-release.sh makes (the real config page), and returns the staged tree and manifest.
fn staged(extra: &[&str]) -> (tempfile::TempDir, String) {
    let root = env!("CARGO_MANIFEST_DIR");
    let tmp = tempfile::tempdir().unwrap();
    let dist = tmp.path().join("dist");
    for d in ["man", "completions"] {
        std::fs::create_dir_all(dist.join(d)).unwrap();
    }
    std::fs::write(dist.join("vgpu-license-agent"), "#!/bin/sh\n").unwrap();
    std::process::Command::new("chmod")
        .args(["0755", dist.join("vgpu-license-agent").to_str().unwrap()])
        .status()
        .unwrap();
    let page = vgpu_license_agent::cli::manual::config_page(CONFIG, "", "v");
    std::fs::write(dist.join("man/vgpu-license-agent.toml.5"), page).unwrap();
    for page in ["vgpu-license-agent.8", "vgpu-license-agent-run.8"] {
        std::fs::write(dist.join("man").join(page), ".TH X 8\n").unwrap();
    }
    for c in [
        "vgpu-license-agent.bash",
        "_vgpu-license-agent",
        "vgpu-license-agent.fish",
    ] {
        std::fs::write(dist.join("completions").join(c), "").unwrap();
    }
    let dest = tmp.path().join("stage");
    let manifest = tmp.path().join("manifest");
    let out = std::process::Command::new("bash")
        .arg(format!("{root}/packaging/install.sh"))
        .args(["--destdir", dest.to_str().unwrap(), "--prefix", "/usr"])
        .args(["--dist", dist.to_str().unwrap()])
        .args(["--manifest", manifest.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "install.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest = std::fs::read_to_string(manifest).unwrap();
    (tmp, manifest)
}

#[test]
fn both_packages_hold_the_man_pages_units_and_documents() {
    // The .rpm's %files is the manifest; the .deb is the staged tree (with Debian's --set).
    for extra in [
        &[][..],
        &[
            "--set",
            "zshcompdir=/usr/share/zsh/vendor-completions",
            "--set",
            "licensedir=-",
        ][..],
    ] {
        let (tmp, manifest) = staged(extra);
        let stage = tmp.path().join("stage");
        for path in [
            "/usr/share/man/man5/vgpu-license-agent.toml.5.gz",
            "/usr/share/man/man8/vgpu-license-agent-run.8.gz",
            "/usr/share/man/man8/vgpu-license-agent.8.gz",
            "/usr/lib/systemd/system/vgpu-licensed.target",
            "/usr/lib/systemd/system/vgpu-license-agent-wait-licensed.service",
            "/usr/share/doc/vgpu-license-agent/install.md",
            "/usr/share/doc/vgpu-license-agent/fleet.md",
            "/usr/share/doc/vgpu-license-agent/kubevirt.md",
            "/usr/share/doc/vgpu-license-agent/vgpu-license-fleet.json",
            "/usr/share/doc/vgpu-license-agent/user-data-write-files.yaml",
        ] {
            assert!(
                stage.join(&path[1..]).is_file(),
                "{path} is not installed ({extra:?})"
            );
            assert!(
                manifest.lines().any(|l| l.ends_with(&format!(" {path}"))),
                "{path} is not in the manifest:\n{manifest}"
            );
        }
        // Every document of the repository the map names, not only the ones above.
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for (dir, ext) in [
            ("docs", "md"),
            ("deploy/kubernetes/dashboard", "json"),
            ("cloud-init", "yaml"),
        ] {
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == ext) {
                    let name = p.file_name().unwrap().to_str().unwrap();
                    assert!(
                        stage
                            .join("usr/share/doc/vgpu-license-agent")
                            .join(name)
                            .is_file(),
                        "{dir}/{name} is not in the packages"
                    );
                }
            }
        }
    }
    assert!(INSTALL_MAP.contains("@dist@/man/*.5"), "{INSTALL_MAP}");
}

#[test]
fn the_installed_units_start_the_binary_where_bindir_puts_it() {
    let (tmp, _) = staged(&["--set", "bindir=/opt/vgpu/bin"]);
    let unit = |name: &str| {
        std::fs::read_to_string(tmp.path().join("stage/usr/lib/systemd/system").join(name)).unwrap()
    };
    let main = unit("vgpu-license-agent.service");
    assert!(
        main.contains(
            "\nExecReload=/opt/vgpu/bin/vgpu-license-agent config check --reload $MAINPID\n"
        ),
        "{main}"
    );
    assert!(
        main.contains("\nExecStart=/opt/vgpu/bin/vgpu-license-agent run\n"),
        "{main}"
    );
    let wait = unit("vgpu-license-agent-wait-licensed.service");
    assert!(
        wait.contains("\nExecStart=/opt/vgpu/bin/vgpu-license-agent status --wait"),
        "{wait}"
    );
}
