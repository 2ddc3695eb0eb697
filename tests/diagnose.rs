//! `diagnose` end to end: the real binary against a fake root whose nvidia-smi, systemctl
//! and journalctl are shell scripts written here, a token naming a loopback HTTPS "DLS"
//! started here, lines and exit codes checked, `--json` validated against the report schema.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::thread;

use crate::common::Root;
use chrono::Utc;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection};
use serde_json::Value;

/// A loopback HTTPS server with a self-signed certificate; every `GET` gets a 404 whose
/// `Date` is now plus `offset` seconds. Serves until the test process ends; returns its port.
fn dls(offset: i64) -> u16 {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "loopback dls");
    let cert = params.self_signed(&key).unwrap();
    let cfg = Arc::new(
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for mut sock in listener.incoming().flatten() {
            let cfg = cfg.clone();
            thread::spawn(move || {
                let mut conn = ServerConnection::new(cfg).unwrap();
                let mut tls = rustls::Stream::new(&mut conn, &mut sock);
                if crate::common::read_request_head(&mut tls).is_none() {
                    return;
                }
                let date = (Utc::now() + chrono::Duration::seconds(offset))
                    .format("%a, %d %b %Y %H:%M:%S GMT");
                let resp = format!(
                    "HTTP/1.1 404 Not Found\r\nDate: {date}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = tls.write_all(resp.as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    port
}

/// A loopback port where a connection is refused, for as long as the socket lives: bound,
/// never listening, so that no other test's server can take the port meanwhile.
fn closed_port() -> (socket2::Socket, u16) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let port = s.local_addr().unwrap().as_socket().unwrap().port();
    (s, port)
}

/// The test token of `common`, naming `host:port` as its one DLS node.
fn token_for(host: &str, port: u16, nbf: i64, exp: i64) -> Vec<u8> {
    crate::common::sim::edit_payload(&crate::common::token("diagnose", nbf, exp), |payload| {
        let sic = &mut payload["service_instance_configuration"];
        sic["node_url_list"][0]["url"] = host.into();
        for m in sic["svc_port_set_list"][0]["svc_port_map"]
            .as_array_mut()
            .unwrap()
        {
            m["port"] = port.into();
        }
    })
}

fn script(root: &Root, name: &str, body: &str) -> String {
    let p = root.path(name);
    fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    crate::common::make_executable(&p);
    p.display().to_string()
}

/// nvidia-smi -q of a licensed GRID A100-4C whose lease runs two more days.
fn licensed_smi() -> String {
    let sample =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/samples/smi-jp-dls-guide-2.txt");
    let text = fs::read_to_string(sample).unwrap();
    let exp = (Utc::now() + chrono::Duration::days(2)).format("%Y-%-m-%-d %-H:%-M:%-S");
    text.replace("2022-5-27 0:8:28", &exp.to_string())
}

struct Guest {
    root: Root,
}

impl Guest {
    /// A guest with a licensed vGPU, gridd active, gridd.conf FeatureType=1, and `token`
    /// installed with mode 0744 (when given).
    fn new(token: Option<&[u8]>) -> Guest {
        let mut root = Root::new();
        root.file("smi.txt", licensed_smi().as_bytes());
        let smi = script(
            &root,
            "nvidia-smi",
            &format!("cat '{}'", root.path("smi.txt").display()),
        );
        let systemctl = script(
            &root,
            "systemctl",
            &format!("cat '{}'", root.path("unit-state").display()),
        );
        let journalctl = script(&root, "journalctl", "exit 0");
        root.file("unit-state", b"active\n");
        root.dropin(
            "50-diagnose.toml",
            &format!(
                "[commands]\nnvidia_smi = \"{smi}\"\nsystemctl = \"{systemctl}\"\njournalctl = \"{journalctl}\"\n\
                 [service]\nprobe_timeout_seconds = 2\nclock_skew_max_seconds = 60\n"
            ),
        );
        root.file("etc/nvidia/gridd.conf", b"# managed\nFeatureType=1\n");
        if let Some(t) = token {
            root.secrets.push(t.to_vec());
            let p = root.file(
                "etc/nvidia/ClientConfigToken/client_configuration_token.tok",
                t,
            );
            fs::set_permissions(&p, fs::Permissions::from_mode(0o744)).unwrap();
        }
        Guest { root }
    }

    /// `diagnose`: exit code and the lines by check name (`STATUS message`).
    fn human(&self) -> (i32, Vec<(String, String, String)>, String) {
        self.human_of(self.root.run(&["diagnose"]))
    }

    fn human_of(&self, r: crate::common::Run) -> (i32, Vec<(String, String, String)>, String) {
        assert!(r.stderr.is_empty(), "{}", r.stderr);
        let lines = r
            .stdout
            .lines()
            .filter(|l| !l.contains(" checks: ") && !l.contains(" check: "))
            .map(|l| {
                let mut it = l.splitn(3, ' ').filter(|s| !s.is_empty());
                let status = it.next().unwrap().to_string();
                let rest = l[status.len()..].trim_start();
                let (name, msg) = rest.split_once(' ').unwrap();
                (status, name.to_string(), msg.trim_start().to_string())
            })
            .collect();
        (r.code.unwrap(), lines, r.stdout)
    }

    fn json(&self) -> (i32, Value) {
        let r = self.root.run(&["diagnose", "--json"]);
        let v: Value = serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", r.stdout, r.stderr));
        let schema: Value = serde_json::from_slice(
            &fs::read(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report.schema.json"),
            )
            .unwrap(),
        )
        .unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "schema errors {errors:?}");
        (r.code.unwrap(), v)
    }
}

fn line<'a>(lines: &'a [(String, String, String)], name: &str) -> (&'a str, &'a str) {
    let l = lines
        .iter()
        .find(|l| l.1 == name)
        .unwrap_or_else(|| panic!("no {name} line in {lines:?}"));
    (&l.0, &l.2)
}

fn statuses(v: &Value) -> Vec<(String, String)> {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_healthy_guest_passes_every_check() {
    let port = dls(0);
    let g = Guest::new(Some(&token_for(
        "localhost",
        port,
        1_700_000_000,
        2_078_691_200,
    )));
    let (code, lines, out) = g.human();
    assert_eq!(code, 0, "{out}");
    // The token names a DLS, not NVIDIA's CLS.
    assert!(out.contains("licensing mode: DLS"), "{out}");
    let names: Vec<&str> = lines.iter().map(|l| l.1.as_str()).collect();
    assert_eq!(
        names,
        [
            "driver",
            "vgpu",
            "mode",
            "token",
            "token-mode",
            "token-dir",
            "token-owner",
            "gridd.conf",
            "gridd",
            "dls-dns",
            "dls-tcp",
            "dls-tls",
            "dls-https",
            "clock",
            "license"
        ],
        "{out}"
    );
    assert!(lines.iter().all(|l| l.0 == "OK"), "{out}");
    assert!(
        line(&lines, "dls-dns").1.contains("localhost resolves to"),
        "{out}"
    );
    assert!(
        line(&lines, "dls-tls").1.contains("CN=loopback dls"),
        "{out}"
    );
    assert!(
        line(&lines, "clock")
            .1
            .contains("DLS localhost (within 60 s)"),
        "{out}"
    );
    assert!(
        line(&lines, "license")
            .1
            .starts_with("licensed, NVIDIA Virtual Compute Server"),
        "{out}"
    );
    assert!(
        out.ends_with("15 checks: 15 ok, 0 warning, 0 failed, 0 skipped\n"),
        "{out}"
    );

    let (code, v) = g.json();
    assert_eq!(code, 0);
    assert_eq!(v["state"], "licensed");
    assert_eq!(v["failure"], Value::Null);
    assert_eq!(v["dls"][0]["host"], "localhost");
    assert_eq!(v["licensing_mode"], "dls");
    assert_eq!(v["dls"][0]["port"], port);
    let probe = &v["dls_probes"][0];
    assert_eq!(probe["port"], port);
    assert_eq!(probe["steps"].as_array().unwrap().len(), 4);
    assert!(probe["clock_skew_seconds"].as_f64().unwrap().abs() < 2.0);
    assert_eq!(probe["certificate"]["subject"], "CN=loopback dls");
    assert!(statuses(&v).iter().all(|s| s.1 == "ok"));
}

#[test]
fn a_skewed_dls_clock_is_a_failure_with_its_fix() {
    let port = dls(-600);
    let g = Guest::new(Some(&token_for(
        "localhost",
        port,
        1_700_000_000,
        2_078_691_200,
    )));
    let (code, lines, out) = g.human();
    assert_eq!(code, 2, "{out}");
    let (status, msg) = line(&lines, "clock");
    assert_eq!(status, "FAIL");
    assert!(
        msg.contains("s ahead of DLS localhost (more than the 60 s allowed)"),
        "{msg}"
    );
    assert!(msg.contains("-> ") && msg.contains("timedatectl"), "{msg}");
    assert_eq!(line(&lines, "dls-https").0, "OK");
    // Licensed still, but the failure shows: a warning there.
    assert_eq!(line(&lines, "license").0, "WARN", "{out}");

    let (code, v) = g.json();
    assert_eq!(code, 2);
    assert_eq!(v["state"], "licensed");
    assert_eq!(v["failure"]["reason"], "clock_skew");
    let m = v["failure"]["message"].as_str().unwrap();
    assert!(
        m.starts_with("guest clock is ") && m.contains("ahead of DLS localhost"),
        "{m}"
    );
    let skew = v["dls_probes"][0]["clock_skew_seconds"].as_f64().unwrap();
    assert!((598.0..=602.0).contains(&skew), "{skew}");
}

#[test]
fn a_refused_dls_port_names_the_step_and_the_host() {
    let (_closed, port) = closed_port();
    let g = Guest::new(Some(&token_for(
        "127.0.0.1",
        port,
        1_700_000_000,
        2_078_691_200,
    )));
    let (code, lines, out) = g.human();
    assert_eq!(code, 2, "{out}");
    assert_eq!(line(&lines, "dls-dns").0, "OK");
    let (status, msg) = line(&lines, "dls-tcp");
    assert_eq!(status, "FAIL");
    assert!(
        msg.starts_with(&format!(
            "127.0.0.1:{port}: TCP connect failed: connection refused -> open TCP {port}"
        )),
        "{msg}"
    );
    assert_eq!(
        line(&lines, "dls-tls"),
        (
            "SKIP",
            &*format!("127.0.0.1:{port}: skipped, TCP connect failed")
        )
    );
    assert_eq!(line(&lines, "clock").0, "SKIP");

    let (_, v) = g.json();
    assert_eq!(v["failure"]["reason"], "dls_unreachable");
    assert_eq!(
        v["failure"]["message"],
        format!("DLS 127.0.0.1:{port}: TCP connect failed: connection refused")
    );
}

/// A port that takes the connection and answers no TLS (an old appliance's handshake that
/// fails, as the DLS before 3.4 does for a vGPU 18 client): the TLS step fails. With a
/// driver of vGPU 18 or later (570 on), the fix names the DLS version it needs; with an
/// older one, it does not.
#[test]
fn a_failed_tls_handshake_with_a_vgpu_18_driver_names_dls_3_4() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for mut sock in listener.incoming().flatten() {
            let _ = sock.write_all(b"\x15\x03\x01\x00\x02\x02\x28");
        }
    });
    let token = token_for("127.0.0.1", port, 1_700_000_000, 2_078_691_200);
    for (driver, named) in [("570.124.06", true), ("510.47.03", false)] {
        let g = Guest::new(Some(&token));
        g.root.file(
            "smi.txt",
            licensed_smi().replace("510.47.03", driver).as_bytes(),
        );
        let (_, lines, out) = g.human();
        assert_eq!(line(&lines, "dls-tcp").0, "OK", "{out}");
        let (status, msg) = line(&lines, "dls-tls");
        assert_eq!(status, "FAIL", "{out}");
        assert_eq!(
            msg.contains("the DLS must be 3.4 or later"),
            named,
            "driver {driver}: {msg}"
        );
    }
}

#[test]
fn no_token_fails_and_skips_the_dls() {
    let g = Guest::new(None);
    let (code, lines, out) = g.human();
    assert_eq!(code, 2, "{out}");
    let (status, msg) = line(&lines, "token");
    assert_eq!(status, "FAIL");
    assert!(
        msg.starts_with("no token at ") && msg.contains("vgpu-license-agent install --token-file"),
        "{msg}"
    );
    assert_eq!(line(&lines, "token-mode").0, "SKIP");
    assert_eq!(
        line(&lines, "dls"),
        ("SKIP", "DLS checks skipped: no usable token names a DLS")
    );
    assert!(!lines.iter().any(|l| l.1.starts_with("dls-")), "{out}");

    let (code, v) = g.json();
    assert_eq!(code, 2);
    assert_eq!(v["failure"]["reason"], "token_missing");
    assert_eq!(v["dls_probes"], Value::Array(vec![]));
}

/// nvidia-smi -q of the same guest, its `License Status` replaced by `status`.
fn smi_with_status(status: &str) -> String {
    licensed_smi()
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("License Status") {
                format!("        License Status                    : {status}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

#[test]
fn a_cloud_provider_guest_is_not_asked_for_a_token() {
    let g = Guest::new(None);
    g.root.file(
        "smi.txt",
        smi_with_status("Licensed (Expiry: N/A)").as_bytes(),
    );
    let (code, lines, out) = g.human();
    assert_eq!(code, 0, "{out}");
    assert!(line(&lines, "mode").1.contains("cloud provider"), "{out}");
    assert_eq!(line(&lines, "token").0, "SKIP", "{out}");
    assert!(!out.contains("install --token-file"), "{out}");
    assert_eq!(line(&lines, "license").0, "OK", "{out}");
    let (code, v) = g.json();
    assert_eq!(code, 0);
    assert_eq!(v["licensing_mode"], "cloud_provider");
    assert_eq!(v["failure"], Value::Null);
}

#[test]
fn a_legacy_guest_keeps_its_server_keys_and_is_told_the_way_off() {
    let g = Guest::new(None);
    g.root
        .file("smi.txt", smi_with_status("Licensed").as_bytes());
    g.root.file(
        "etc/nvidia/gridd.conf",
        b"ServerAddress=10.0.0.5\nServerPort=7070\nFeatureType=1\n",
    );
    let (code, lines, out) = g.human();
    assert_eq!(code, 0, "{out}");
    assert!(line(&lines, "mode").1.contains("legacy"), "{out}");
    assert_eq!(line(&lines, "token").0, "SKIP", "{out}");
    // The keys license this guest: no advice to remove them.
    assert_eq!(line(&lines, "gridd.conf").0, "OK", "{out}");
    let (status, msg) = line(&lines, "license");
    assert_eq!(status, "OK", "{out}");
    assert!(msg.contains("end of life") && msg.contains("DLS"), "{msg}");
    let (_, v) = g.json();
    assert_eq!(v["licensing_mode"], "legacy");
}

#[test]
fn an_expired_token_says_so_and_how_to_replace_it() {
    let g = Guest::new(Some(&token_for(
        "localhost",
        443,
        1_600_000_000,
        1_650_000_000,
    )));
    let (code, lines, out) = g.human();
    assert_eq!(code, 2, "{out}");
    let (status, msg) = line(&lines, "token");
    assert_eq!(status, "FAIL");
    assert!(
        msg.contains("the installed token expired at 2022-04-15T05:20:00Z"),
        "{msg}"
    );
    assert!(
        msg.contains("-> generate a client configuration token on the DLS"),
        "{msg}"
    );
    let (_, v) = g.json();
    assert_eq!(v["failure"]["reason"], "token_expired");
}

#[test]
fn warnings_for_mode_strays_and_legacy_keys_exit_1() {
    let port = dls(0);
    let g = Guest::new(Some(&token_for(
        "localhost",
        port,
        1_700_000_000,
        2_078_691_200,
    )));
    let r = &g.root;
    // An old token beside the token: which one gridd uses is not known.
    let old = token_for("localhost", port, 1_600_000_000, 2_078_000_000);
    r.file("etc/nvidia/ClientConfigToken/old.tok", &old);
    // The token changed after it (its mode, here): the one that appeared last is the token.
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::set_permissions(r.token_path(), fs::Permissions::from_mode(0o600)).unwrap();
    r.file(
        "etc/nvidia/gridd.conf",
        b"FeatureType=1\nServerAddress=10.0.0.5\n",
    );
    let (code, lines, out) = g.human();
    assert_eq!(code, 1, "{out}");
    let (status, msg) = line(&lines, "token-mode");
    assert_eq!(status, "WARN");
    assert!(
        msg.starts_with("mode 0600, NVIDIA asks for 0744") && msg.contains("-> chmod 0744"),
        "{msg}"
    );
    let (status, msg) = line(&lines, "token-dir");
    assert_eq!(status, "WARN");
    assert!(msg.contains("also holds old tokens (old.tok)"), "{msg}");
    let (status, msg) = line(&lines, "gridd.conf");
    assert_eq!(status, "WARN");
    assert!(
        msg.contains("ServerAddress=10.0.0.5") && msg.contains("legacy"),
        "{msg}"
    );
    assert_eq!(line(&lines, "license").0, "OK", "{out}");
}

/// The classic mistake: a gridd.conf copied into the token directory. gridd reads every
/// file there and exits on it, so it is a failure, with a fix that works.
#[test]
fn a_gridd_conf_in_the_token_directory_fails() {
    let port = dls(0);
    let g = Guest::new(Some(&token_for(
        "localhost",
        port,
        1_700_000_000,
        2_078_691_200,
    )));
    g.root.file(
        "etc/nvidia/ClientConfigToken/gridd.conf",
        b"FeatureType=1\n",
    );
    let (code, lines, out) = g.human();
    assert_eq!(code, 2, "{out}");
    let (status, msg) = line(&lines, "token-dir");
    assert_eq!(status, "FAIL", "{out}");
    assert!(
        msg.contains("also holds gridd.conf") && msg.contains("exits"),
        "{msg}"
    );
    assert!(msg.contains("-> move them out of"), "{msg}");
    // The token itself is still the token.
    assert_eq!(line(&lines, "token").0, "OK", "{out}");
}

/// A token saved under the DLS's download name is the installed token: no `token_missing`.
#[test]
fn a_token_under_the_download_name_is_the_token() {
    let port = dls(0);
    let g = Guest::new(None);
    let tok = token_for("localhost", port, 1_700_000_000, 2_078_691_200);
    let name = "etc/nvidia/ClientConfigToken/client_configuration_token_11-30-2026-10-00-00.tok";
    g.root.file(name, &tok);
    fs::set_permissions(g.root.path(name), fs::Permissions::from_mode(0o744)).unwrap();
    let (_, lines, out) = g.human();
    let (status, msg) = line(&lines, "token");
    assert_eq!(status, "OK", "{out}");
    assert!(
        msg.contains("client_configuration_token_11-30-2026-10-00-00.tok: decodes"),
        "{msg}"
    );
    assert_eq!(line(&lines, "token-dir").0, "OK", "{out}");
    let (_, v) = g.json();
    assert_ne!(v["failure"]["reason"], "token_missing", "{v}");
    // `token inspect` without a file reads the same token, under the name it has.
    let r = g.root.run(&["token", "inspect"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("client_configuration_token_11-30-2026-10-00-00.tok")
            && r.stdout.contains("Validity:   valid now"),
        "{}",
        r.stdout
    );
}

/// The guest's clock 20 minutes behind: the token the DLS issued a moment ago reads as not
/// valid yet, and the DLS is asked all the same, so that the clock itself is measured and
/// named as the cause.
#[test]
fn a_token_not_yet_valid_is_a_clock_behind_and_the_clock_is_measured() {
    let port = dls(1200);
    let issued = Utc::now().timestamp() + 1190;
    let g = Guest::new(Some(&token_for("localhost", port, issued, 2_078_691_200)));
    let (code, lines, out) = g.human();
    assert_eq!(code, 2, "{out}");
    let (status, msg) = line(&lines, "token");
    assert_eq!(status, "FAIL", "{out}");
    assert!(msg.contains("not valid before"), "{msg}");
    assert_eq!(line(&lines, "dls-https").0, "OK", "{out}");
    let (status, msg) = line(&lines, "clock");
    assert_eq!(status, "FAIL", "{out}");
    assert!(msg.contains("s behind DLS localhost"), "{msg}");

    let (_, v) = g.json();
    assert_eq!(v["failure"]["reason"], "clock_skew", "{v}");
    let m = v["failure"]["message"].as_str().unwrap();
    assert!(
        m.contains("behind DLS localhost") && m.contains("not valid before"),
        "{m}"
    );
    let skew = v["dls_probes"][0]["clock_skew_seconds"].as_f64().unwrap();
    assert!((-1202.0..=-1198.0).contains(&skew), "{skew}");
}

#[test]
fn a_wrong_feature_type_and_a_stopped_gridd_fail() {
    let port = dls(0);
    let g = Guest::new(Some(&token_for(
        "localhost",
        port,
        1_700_000_000,
        2_078_691_200,
    )));
    g.root.file("etc/nvidia/gridd.conf", b"FeatureType=4\n");
    g.root.file("unit-state", b"inactive\n");
    let (code, lines, out) = g.human();
    assert_eq!(code, 2, "{out}");
    let (status, msg) = line(&lines, "gridd.conf");
    assert_eq!(status, "FAIL");
    assert!(
        msg.contains("FeatureType=4")
            && msg.contains("GRID A100-4C")
            && msg.contains("-> set FeatureType=1"),
        "{msg}"
    );
    let (status, msg) = line(&lines, "gridd");
    assert_eq!(status, "FAIL");
    assert!(
        msg.starts_with("nvidia-gridd.service is inactive -> `systemctl enable --now"),
        "{msg}"
    );

    let (_, v) = g.json();
    assert_eq!(v["failure"]["reason"], "gridd_not_running");
    let by_name = statuses(&v);
    assert!(by_name.contains(&("gridd.conf".into(), "fail".into())));
}

#[test]
fn no_driver_is_a_failure_not_an_error() {
    let g = Guest::new(None);
    let smi = script(
        &g.root,
        "nvidia-smi",
        "echo 'NVIDIA-SMI has failed because it couldn'\\''t communicate with the NVIDIA driver.' >&2; exit 9",
    );
    g.root.dropin(
        "60-smi.toml",
        &format!("[commands]\nnvidia_smi = \"{smi}\"\n"),
    );
    // With the unit unknown, the agent looks for a gridd process: among its own alone.
    let (code, lines, out) = g.human_of(g.root.run_own_pids(&["diagnose"]));
    assert_eq!(code, 2, "{out}");
    let (status, msg) = line(&lines, "driver");
    assert_eq!(status, "FAIL");
    assert!(
        msg.contains("couldn't communicate with the NVIDIA driver")
            && msg.contains("->")
            && msg.contains("GRID guest driver"),
        "{msg}"
    );
    assert_eq!(line(&lines, "vgpu").0, "SKIP");
    let (_, v) = g.json();
    assert_eq!(v["state"], "no_driver");
}

#[test]
fn a_check_that_cannot_run_is_unknown_to_monitoring() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config.toml");
    fs::write(&bad, "[service]\npoll_licensed_seconds = \"often\"\n").unwrap();
    let code = |args: &[&str]| {
        let out = std::process::Command::new(crate::common::BIN)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), err)
    };
    let cfg = bad.to_str().unwrap();
    // A bad config or a wrong option: 3 (UNKNOWN), never 1 (WARNING) or 2 (CRITICAL).
    for args in [
        &["--config", cfg, "status"][..],
        &["--config", cfg, "diagnose"],
        &["status", "--no-such-option"],
        &["diagnose", "--json", "extra"],
        &["analyze", "--smi", "/nonexistent/smi.txt"],
    ] {
        let (c, err) = code(args);
        assert_eq!(c, Some(3), "{args:?}: {err}");
        assert!(!err.trim().is_empty(), "{args:?}");
    }
    let (c, err) = code(&["--config", cfg, "status"]);
    assert!(err.contains("poll_licensed_seconds"), "{c:?} {err}");
    // Other commands keep the usual codes.
    assert_eq!(code(&["install", "--no-such-option"]).0, Some(2));
    assert_eq!(code(&["--config", cfg, "prepare-image"]).0, Some(1));
    assert_eq!(code(&["status", "--help"]).0, Some(0));
}

// The proxy of gridd.conf (`ProxyServerAddress`, `ProxyServerPort`): the probe goes through
// it as gridd does, by CONNECT, and `diagnose` says so.

use std::time::{Duration, Instant};
use vgpu_license_agent::probe::{NodeProbe, StepName, probe_node_via, verdict};
use vgpu_license_model::gridd_conf::Proxy;
use vgpu_license_model::report::Reason;

const T: Duration = Duration::from_millis(1500);

fn names(p: &NodeProbe) -> Vec<(StepName, bool)> {
    p.steps.iter().map(|s| (s.name, s.ok)).collect()
}

/// What the test proxy answers to `CONNECT`.
#[derive(Clone, Copy)]
enum ProxyAnswer {
    /// `200 Connection established`, then bytes both ways.
    Tunnel,
    /// This status line, and the connection closed.
    Status(&'static str),
}

/// A loopback HTTP proxy that takes `CONNECT host:port` only (what gridd's proxy support
/// asks). Returns its port and the targets it was asked for.
fn connect_proxy(answer: ProxyAnswer) -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = asked.clone();
    thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            let seen = seen.clone();
            thread::spawn(move || {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match client.read(&mut b) {
                        Ok(1) => head.push(b[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let target = head
                    .strip_prefix("CONNECT ")
                    .and_then(|r| r.split(' ').next())
                    .expect("a CONNECT request")
                    .to_string();
                seen.lock().unwrap().push(target.clone());
                match answer {
                    ProxyAnswer::Status(line) => {
                        let _ = client
                            .write_all(format!("{line}\r\nContent-Length: 0\r\n\r\n").as_bytes());
                    }
                    ProxyAnswer::Tunnel => {
                        let Ok(mut server) = std::net::TcpStream::connect(&target) else {
                            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
                            return;
                        };
                        client
                            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                            .unwrap();
                        let (mut c2, mut s2) =
                            (client.try_clone().unwrap(), server.try_clone().unwrap());
                        thread::spawn(move || {
                            let _ = std::io::copy(&mut c2, &mut s2);
                        });
                        let _ = std::io::copy(&mut server, &mut client);
                    }
                }
            });
        }
    });
    (port, asked)
}

fn proxy_at(port: u16, user: Option<&str>) -> Proxy {
    Proxy {
        host: "127.0.0.1".into(),
        port,
        user: user.map(String::from),
    }
}

#[test]
fn through_a_proxy_every_step_goes_the_way_gridd_goes() {
    let dls = dls(-400);
    let (port, asked) = connect_proxy(ProxyAnswer::Tunnel);
    let via = proxy_at(port, None);
    let p = probe_node_via("localhost", dls, Some(&via), T);
    assert_eq!(
        names(&p),
        [
            (StepName::Dns, true),
            (StepName::Tcp, true),
            (StepName::Tls, true),
            (StepName::Https, true)
        ],
        "{p:#?}"
    );
    // The proxy resolves the DLS's name: the guest looked up only the proxy's.
    assert_eq!(*asked.lock().unwrap(), [format!("localhost:{dls}")]);
    assert!(p.steps[0].detail.contains("proxy 127.0.0.1"), "{p:#?}");
    assert!(
        p.steps[1]
            .detail
            .contains(&format!("proxy 127.0.0.1:{port}"))
            && p.steps[1].detail.contains("200"),
        "{p:#?}"
    );
    assert_eq!(
        p.proxy.as_deref(),
        Some(format!("127.0.0.1:{port}").as_str())
    );
    // The clock is measured through the tunnel as well.
    let skew = p.clock_skew_seconds.expect("a skew");
    assert!((skew - 400.0).abs() < 5.0, "{skew}");
    assert_eq!(
        verdict(&[p], Duration::from_secs(60)).map(|v| v.0),
        Some(Reason::ClockSkew)
    );
}

#[test]
fn a_proxy_that_refuses_the_tunnel_fails_the_tcp_step_and_says_so() {
    let (port, _) = connect_proxy(ProxyAnswer::Status("HTTP/1.1 403 Forbidden"));
    let via = proxy_at(port, None);
    let p = probe_node_via("api.cls.licensing.nvidia.com", 443, Some(&via), T);
    assert_eq!(names(&p), [(StepName::Dns, true), (StepName::Tcp, false)]);
    let line = p.failure_line().unwrap();
    assert!(
        line.contains(&format!("through proxy 127.0.0.1:{port}"))
            && line.contains(
                "refused a tunnel to api.cls.licensing.nvidia.com:443 (HTTP 403 Forbidden)"
            ),
        "{line}"
    );
    let v = verdict(&[p], Duration::from_secs(60)).unwrap();
    assert_eq!(v.0, Reason::DlsUnreachable);

    // A proxy that is not there.
    let (_closed, port) = closed_port();
    let via = proxy_at(port, None);
    let p = probe_node_via("api.cls.licensing.nvidia.com", 443, Some(&via), T);
    assert_eq!(names(&p), [(StepName::Dns, true), (StepName::Tcp, false)]);
    assert!(p.steps[1].detail.contains("connection refused"), "{p:#?}");
}

#[test]
fn a_proxy_that_wants_credentials() {
    let (port, _) = connect_proxy(ProxyAnswer::Status(
        "HTTP/1.1 407 Proxy Authentication Required",
    ));
    // gridd.conf gives none: a finding, with the keys to set.
    let p = probe_node_via("dls.example", 443, Some(&proxy_at(port, None)), T);
    assert!(!p.inconclusive);
    assert!(
        p.steps[1]
            .detail
            .contains("set ProxyUserName and ProxyCredentialsFilePath"),
        "{p:#?}"
    );
    assert_eq!(
        verdict(&[p], Duration::from_secs(60)).map(|v| v.0),
        Some(Reason::DlsUnreachable)
    );
    // gridd has credentials the agent cannot use: no finding either way.
    let p = probe_node_via("dls.example", 443, Some(&proxy_at(port, Some("svc"))), T);
    assert!(p.inconclusive, "{p:#?}");
    assert!(p.steps[1].detail.contains("encrypted for gridd"), "{p:#?}");
    assert_eq!(verdict(&[p], Duration::from_secs(60)), None);
}

#[test]
fn a_proxy_that_does_not_speak_http_or_never_answers() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let garbage = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for mut sock in listener.incoming().flatten() {
            let _ = sock.write_all(b"\x16\x03\x01\x00\x02\x02\x28");
            let _ = sock.read(&mut [0u8; 4096]);
        }
    });
    let p = probe_node_via("dls.example", 443, Some(&proxy_at(garbage, None)), T);
    assert!(p.steps[1].detail.contains("not an HTTP response"), "{p:#?}");
    // Takes the connection and says nothing: the TCP step's time limit ends it.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = listener.local_addr().unwrap().port();
    let _hold = thread::spawn(move || {
        let _conns: Vec<_> = listener.incoming().take(1).collect();
        thread::sleep(Duration::from_secs(10));
    });
    let started = Instant::now();
    let p = probe_node_via("dls.example", 443, Some(&proxy_at(silent, None)), T);
    assert!(started.elapsed() < T * 3, "{:?}", started.elapsed());
    assert!(p.steps[1].detail.contains("no answer within"), "{p:#?}");
}

fn cls_token() -> Vec<u8> {
    token_for(
        "api.cls.licensing.nvidia.com",
        443,
        1_700_000_000,
        2_078_691_200,
    )
}

fn with_proxy(g: &Guest, keys: &str) {
    g.root.file(
        "etc/nvidia/gridd.conf",
        format!("# managed\nFeatureType=1\n{keys}").as_bytes(),
    );
}

#[test]
fn diagnose_goes_through_gridds_proxy_to_the_cloud_license_service() {
    let (port, asked) = connect_proxy(ProxyAnswer::Status("HTTP/1.1 403 Forbidden"));
    let g = Guest::new(Some(&cls_token()));
    with_proxy(
        &g,
        &format!("ProxyServerAddress=127.0.0.1\nProxyServerPort={port}\n"),
    );
    let (code, lines, out) = g.human();
    assert_eq!(code, 2, "{out}");
    assert!(line(&lines, "mode").1.contains("CLS"), "{out}");
    let (status, msg) = line(&lines, "proxy");
    assert_eq!(status, "OK", "{out}");
    assert!(msg.contains(&format!("proxy 127.0.0.1:{port}")), "{msg}");
    let (status, msg) = line(&lines, "dls-tcp");
    assert_eq!(status, "FAIL", "{out}");
    assert!(
        msg.contains("refused a tunnel to api.cls.licensing.nvidia.com:443 (HTTP 403 Forbidden)")
            && msg.contains("allows CONNECT"),
        "{msg}"
    );
    // The guest looked up nothing but the proxy: the name went to the proxy.
    assert!(
        asked
            .lock()
            .unwrap()
            .iter()
            .all(|t| t == "api.cls.licensing.nvidia.com:443")
    );
    let (_, v) = g.json();
    assert_eq!(v["failure"]["reason"], "dls_unreachable", "{v:#}");
    assert!(
        v["failure"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("through proxy 127.0.0.1:{port}")),
        "{v:#}"
    );
}

#[test]
fn proxy_keys_gridd_cannot_use_are_a_failure_with_the_fix() {
    let g = Guest::new(Some(&cls_token()));
    with_proxy(&g, "ProxyServerAddress=proxy.corp.example\n");
    let (_, lines, out) = g.human();
    let (status, msg) = line(&lines, "proxy");
    assert_eq!(status, "FAIL", "{out}");
    assert!(
        msg.contains("no ProxyServerPort") && msg.contains("add ProxyServerPort="),
        "{msg}"
    );
}

/// The same image on a VM without a vGPU: no NVIDIA device on the PCI bus is `no_gpu`,
/// nothing to license, exit 0 everywhere, and nvidia-smi is not even asked.
#[test]
fn a_guest_without_a_gpu_is_no_gpu_and_nothing_fails() {
    let g = Guest::new(None);
    crate::common::no_pci_gpu(g.root.path("").as_path());
    let (code, lines, out) = g.human();
    assert_eq!(code, 0, "{out}");
    assert_eq!(lines.len(), 1, "{out}");
    let (status, msg) = line(&lines, "gpu");
    assert_eq!(status, "OK");
    assert!(msg.contains("nothing to license"), "{msg}");
    assert!(
        out.ends_with("\n1 check: 1 ok, 0 warning, 0 failed, 0 skipped\n"),
        "{out}"
    );
    let (code, v) = g.json();
    assert_eq!(code, 0);
    assert_eq!(v["state"], "no_gpu", "{v}");
    assert!(v["failure"].is_null(), "{v}");
}

/// A vGPU whose driver does not load: the driver is the headline and its fix; the token
/// (missing too) is listed, not the failure. No fix names a unit that is not there.
#[test]
fn without_a_driver_the_driver_comes_first() {
    let g = Guest::new(None);
    let smi = script(
        &g.root,
        "nvidia-smi",
        "echo 'Failed to initialize NVML: Unknown Error'; exit 255",
    );
    crate::common::pci_device(g.root.path("").as_path(), "0000:02:01.0", None);
    g.root.file("unit-state", b"unknown\n");
    g.root.dropin(
        "60-smi.toml",
        &format!("[commands]\nnvidia_smi = \"{smi}\"\n"),
    );
    // In a PID namespace of its own: a boot test's guest may run an nvidia-gridd on this
    // machine, which the agent would see as gridd running without its unit.
    let (code, lines, out) = g.human_of(g.root.run_own_pids(&["diagnose"]));
    assert_eq!(code, 2, "{out}");
    let (status, msg) = line(&lines, "driver");
    assert_eq!(status, "FAIL");
    assert!(
        msg.contains("Failed to initialize NVML") && msg.contains("no driver bound"),
        "{msg}"
    );
    assert!(msg.contains("dkms status"), "{msg}");
    let (status, msg) = line(&lines, "gridd");
    assert_eq!(status, "FAIL");
    assert!(
        msg.contains("is not installed") && !msg.contains("enable --now"),
        "{msg}"
    );
    assert!(
        msg.contains("comes with the NVIDIA vGPU (GRID) guest driver"),
        "{msg}"
    );
    // Nothing observed tells the mode: not an OK.
    assert_eq!(line(&lines, "mode").0, "SKIP", "{out}");
    // Every fix that is a command can work on this guest: none acts on the gridd unit that
    // is not there (systemctl would answer "Unit ... not found"), and each names a program
    // a guest has, or the driver brings once installed.
    let known = [
        "vgpu-license-agent",
        "dmesg",
        "dkms",
        "uname",
        "lspci",
        "modprobe",
        "journalctl",
        "timedatectl",
        "nvidia-smi",
        "ls",
        "chown",
        "chmod",
        "sudo",
    ];
    for (_, name, msg) in &lines {
        let Some((_, fix)) = msg.split_once(" -> ") else {
            continue;
        };
        for cmd in fix.split('`').skip(1).step_by(2) {
            let program = cmd.split_whitespace().next().unwrap_or_default();
            assert!(
                !(program == "systemctl" && cmd.contains("nvidia-gridd")),
                "{name}: a fix acts on the unit that is not installed: {cmd}"
            );
            assert!(known.contains(&program), "{name}: `{cmd}` in {fix}");
        }
    }
    let (_, report) = g.json();
    assert_eq!(report["state"], "no_driver");
    assert!(
        report["failure"]["advice"]
            .as_str()
            .unwrap()
            .contains("the license comes after the driver"),
        "{report}"
    );
    assert!(
        report["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("token_missing")),
        "{report}"
    );
}

/// systemd answers `inactive` for a unit that does not exist: `diagnose` says where the unit
/// comes from (the GRID guest driver), never `systemctl enable --now` of a unit that is not
/// there.
#[test]
fn an_inactive_unit_that_does_not_exist_is_not_installed() {
    let g = Guest::new(None);
    let systemctl = script(
        &g.root,
        "systemctl-missing",
        "case \"$1\" in show) echo not-found ;; is-active) echo inactive; exit 3 ;; esac",
    );
    g.root.dropin(
        "60-systemctl.toml",
        &format!("[commands]\nsystemctl = \"{systemctl}\"\n"),
    );
    let (_, lines, out) = g.human();
    let (status, msg) = line(&lines, "gridd");
    assert_eq!(status, "FAIL", "{out}");
    assert!(
        msg.contains("is not installed") && !msg.contains("enable --now"),
        "{msg}"
    );
    assert!(msg.contains("GRID"), "{msg}");
    // Advice written for `status` sends the reader here; said here, it would send them round.
    assert!(!out.contains("vgpu-license-agent diagnose`"), "{out}");
}

/// gridd inactive with a start job queued (a `systemctl --no-block restart` at boot, behind
/// the units it is ordered after): not "active", and not a stopped unit to enable either.
/// A FIFO at gridd.conf's path is no permissions problem: gridd reads a regular file there.
#[test]
fn a_queued_start_and_a_fifo_gridd_conf_are_said_as_they_are() {
    let port = dls(0);
    let g = Guest::new(Some(&token_for(
        "localhost",
        port,
        1_700_000_000,
        2_078_691_200,
    )));
    // systemctl as it answers then: `is-active` inactive, `list-jobs --no-legend` the job.
    let systemctl = script(
        &g.root,
        "systemctl-queued",
        "case \"$1\" in\n\
         is-active) echo inactive; exit 3 ;;\n\
         list-jobs) echo '211 nvidia-gridd.service start waiting' ;;\n\
         show) echo loaded ;;\n\
         esac",
    );
    g.root.dropin(
        "60-systemctl.toml",
        &format!("[commands]\nsystemctl = \"{systemctl}\"\n"),
    );
    let conf = g.root.path("etc/nvidia/gridd.conf");
    fs::remove_file(&conf).unwrap();
    nix::unistd::mkfifo(&conf, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let (_, lines, out) = g.human();
    let (status, msg) = line(&lines, "gridd");
    assert_eq!(status, "WARN", "{out}");
    assert!(
        msg.starts_with("nvidia-gridd.service is inactive, with a start job queued")
            && msg.contains("`systemctl list-jobs`"),
        "{msg}"
    );
    let (status, msg) = line(&lines, "gridd.conf");
    assert_eq!(status, "FAIL", "{out}");
    assert!(
        msg.contains("not a regular file") && !msg.contains("permissions"),
        "{msg}"
    );
}
