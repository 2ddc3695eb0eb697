//! Probes against loopback servers started here: a TLS "DLS" with a self-signed certificate
//! and a `Date` the test chooses, a refused port, a plain TCP server, a silent one.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection};

use super::*;

const T: Duration = Duration::from_millis(1500);

fn http_date(t: DateTime<Utc>) -> String {
    t.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

fn server_config() -> Arc<ServerConfig> {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "vgpu test dls");
    let cert = params.self_signed(&key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    Arc::new(cfg)
}

/// What the test DLS does after the TLS handshake.
#[derive(Clone, Copy)]
enum Answer {
    /// `HTTP/1.1 404` with `Date` = now + this offset (seconds).
    DateOffset(i64),
    /// A response without a `Date` header.
    NoDate,
    /// Nothing: reads the request and keeps the connection open.
    Silent,
    /// This status line (after `HTTP/1.1 `), with a `Date`.
    Status(&'static str),
}

/// A loopback HTTPS server; serves until the test process ends. Returns its port.
fn tls_dls(answer: Answer) -> u16 {
    let cfg = server_config();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(mut sock) = sock else { continue };
            let cfg = cfg.clone();
            thread::spawn(move || {
                let mut conn = ServerConnection::new(cfg).unwrap();
                let mut tls = rustls::Stream::new(&mut conn, &mut sock);
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                assert!(req.starts_with(b"GET / HTTP/1.1\r\nHost: "), "{req:?}");
                let date = match answer {
                    Answer::Silent => {
                        thread::sleep(Duration::from_secs(30));
                        return;
                    }
                    Answer::NoDate => String::new(),
                    Answer::Status(line) => {
                        let resp = format!(
                            "HTTP/1.1 {line}\r\nDate: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                            http_date(Utc::now())
                        );
                        let _ = tls.write_all(resp.as_bytes());
                        tls.conn.send_close_notify();
                        let _ = tls.flush();
                        return;
                    }
                    Answer::DateOffset(off) => format!(
                        "Date: {}\r\n",
                        http_date(Utc::now() + chrono::Duration::seconds(off))
                    ),
                };
                let resp = format!(
                    "HTTP/1.1 404 Not Found\r\n{date}Content-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = tls.write_all(resp.as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    port
}

/// A plain TCP server that answers every connection with `bytes` and closes it.
fn plain_server(bytes: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for mut sock in listener.incoming().flatten() {
            let _ = sock.write_all(bytes);
            // Let the client's hello arrive before closing, so the close is not a reset.
            let _ = sock.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = sock.read(&mut [0u8; 4096]);
        }
    });
    port
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn names(p: &NodeProbe) -> Vec<(StepName, bool)> {
    p.steps.iter().map(|s| (s.name, s.ok)).collect()
}

#[test]
fn a_dls_with_the_right_time_passes_every_step() {
    let port = tls_dls(Answer::DateOffset(0));
    let p = probe_node("127.0.0.1", port, T);
    assert_eq!(
        names(&p),
        StepName::ALL.iter().map(|n| (*n, true)).collect::<Vec<_>>(),
        "{p:#?}"
    );
    assert!(p.reachable());
    assert_eq!(p.http_status, Some(404));
    assert_eq!(p.address.as_deref(), Some(&*format!("127.0.0.1:{port}")));
    let cert = p.certificate.as_ref().expect("certificate");
    assert_eq!(cert.subject, "CN=vgpu test dls");
    assert_eq!(cert.issuer, "CN=vgpu test dls");
    assert_eq!(cert.not_before, "1975-01-01T00:00:00Z");
    assert_eq!(cert.not_after, "4096-01-01T00:00:00Z");
    assert_eq!(cert.chain_length, 1);
    assert!(cert.valid_at(Utc::now()));
    let tls = p.step(StepName::Tls).unwrap();
    assert!(tls.detail.contains("CN=vgpu test dls"), "{}", tls.detail);
    let skew = p.clock_skew_seconds.expect("skew measured");
    assert!(skew.abs() < 2.0, "{skew}");
    assert_eq!(verdict(&[p], Duration::from_secs(60)), None);
}

#[test]
fn a_date_ten_minutes_off_is_clock_skew() {
    // The DLS's clock is 10 minutes behind: the guest is ahead.
    let port = tls_dls(Answer::DateOffset(-600));
    let p = probe_node("127.0.0.1", port, T);
    assert!(p.reachable(), "{p:#?}");
    let skew = p.clock_skew_seconds.unwrap();
    assert!((598.0..=602.0).contains(&skew), "{skew}");
    assert_eq!(clock_skew(std::slice::from_ref(&p)), Some(skew));
    let (reason, msg) = verdict(&[p], Duration::from_secs(60)).unwrap();
    assert_eq!(reason, Reason::ClockSkew);
    assert!(
        msg.starts_with("guest clock is 6") && msg.contains("s ahead of DLS 127.0.0.1"),
        "{msg}"
    );
    assert!(msg.contains("60 s allowed"), "{msg}");

    // And ahead of the guest: the guest is behind.
    let port = tls_dls(Answer::DateOffset(300));
    let p = probe_node("127.0.0.1", port, T);
    let skew = p.clock_skew_seconds.unwrap();
    assert!((-302.0..=-298.0).contains(&skew), "{skew}");
    let (reason, msg) = verdict(std::slice::from_ref(&p), Duration::from_secs(60)).unwrap();
    assert_eq!(reason, Reason::ClockSkew);
    assert!(msg.contains("s behind DLS 127.0.0.1"), "{msg}");
    // Within the maximum: no verdict.
    assert_eq!(verdict(&[p], Duration::from_secs(600)), None);
}

#[test]
fn no_date_header_passes_without_a_skew() {
    let port = tls_dls(Answer::NoDate);
    let p = probe_node("localhost", port, T);
    assert!(p.reachable(), "{p:#?}");
    assert_eq!(p.clock_skew_seconds, None);
    assert!(
        p.step(StepName::Https)
            .unwrap()
            .detail
            .contains("no Date header")
    );
    let dns = p.step(StepName::Dns).unwrap();
    assert!(
        dns.detail.contains("localhost resolves to"),
        "{}",
        dns.detail
    );
    assert_eq!(verdict(&[p], Duration::from_secs(60)), None);
}

#[test]
fn a_refused_port_fails_the_tcp_step() {
    let port = free_port();
    let p = probe_node("127.0.0.1", port, T);
    assert_eq!(
        names(&p),
        vec![(StepName::Dns, true), (StepName::Tcp, false)],
        "{p:#?}"
    );
    assert_eq!(p.step(StepName::Tcp).unwrap().detail, "connection refused");
    let (reason, msg) = verdict(&[p], Duration::from_secs(60)).unwrap();
    assert_eq!(reason, Reason::DlsUnreachable);
    assert_eq!(
        msg,
        format!("DLS 127.0.0.1:{port}: TCP connect failed: connection refused")
    );
}

#[test]
fn plain_tcp_fails_the_tls_step() {
    let garbage = plain_server(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    let p = probe_node("127.0.0.1", garbage, T);
    assert_eq!(
        names(&p),
        vec![
            (StepName::Dns, true),
            (StepName::Tcp, true),
            (StepName::Tls, false)
        ],
        "{p:#?}"
    );
    let d = &p.step(StepName::Tls).unwrap().detail;
    assert!(d.contains("is this port serving TLS?"), "{d}");
    let (reason, msg) = verdict(&[p], Duration::from_secs(60)).unwrap();
    assert_eq!(reason, Reason::DlsUnreachable);
    assert!(msg.contains("TLS handshake failed"), "{msg}");

    let closing = plain_server(b"");
    let p = probe_node("127.0.0.1", closing, T);
    let tls = p.step(StepName::Tls).expect("tls step");
    assert!(!tls.ok);
    assert!(
        tls.detail.contains("closed the connection") || tls.detail.contains("reset"),
        "{}",
        tls.detail
    );
}

#[test]
fn an_invalid_name_fails_the_dns_step() {
    let t = Instant::now();
    let p = probe_node("dls.example.invalid", 443, T);
    assert!(t.elapsed() < T + Duration::from_millis(500));
    assert_eq!(names(&p), vec![(StepName::Dns, false)], "{p:#?}");
    let (reason, msg) = verdict(&[p], Duration::from_secs(60)).unwrap();
    assert_eq!(reason, Reason::DlsUnreachable);
    assert!(
        msg.starts_with("DLS dls.example.invalid:443: DNS lookup failed: "),
        "{msg}"
    );
}

#[test]
fn a_server_that_never_answers_times_out_within_the_bound() {
    // Connections complete in the kernel's backlog; nobody ever reads or writes.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let bound = Duration::from_millis(400);
    let t = Instant::now();
    let p = probe_node("127.0.0.1", port, bound);
    let took = t.elapsed();
    assert!(took >= bound && took < bound * 2, "{took:?}");
    let tls = p.step(StepName::Tls).unwrap();
    assert!(!tls.ok);
    assert_eq!(tls.detail, "no answer within 0.4 s");
    drop(listener);

    // TLS answers, HTTP does not.
    let port = tls_dls(Answer::Silent);
    let t = Instant::now();
    let p = probe_node("127.0.0.1", port, bound);
    assert!(t.elapsed() < bound * 3, "{:?}", t.elapsed());
    assert!(p.step(StepName::Tls).unwrap().ok, "{p:#?}");
    let https = p.step(StepName::Https).unwrap();
    assert!(!https.ok);
    assert_eq!(https.detail, "no answer within 0.4 s");
    let (reason, msg) = verdict(&[p], Duration::from_secs(60)).unwrap();
    assert_eq!(reason, Reason::DlsUnreachable);
    assert!(msg.contains("HTTPS request failed: no answer"), "{msg}");
}

#[test]
fn one_reachable_node_is_enough_and_probes_run_in_parallel() {
    let good = tls_dls(Answer::DateOffset(0));
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let bound = Duration::from_millis(500);
    let targets = vec![
        ("127.0.0.1".to_string(), silent.local_addr().unwrap().port()),
        ("127.0.0.1".to_string(), good),
    ];
    let t = Instant::now();
    let probes = probe_all(&targets, None, bound);
    assert!(t.elapsed() < bound * 2, "{:?}", t.elapsed());
    assert_eq!(probes.len(), 2);
    assert!(!probes[0].reachable() && probes[1].reachable());
    assert_eq!(probes[1].port, good);
    assert_eq!(verdict(&probes, Duration::from_secs(60)), None);
    assert_eq!(verdict(&[], Duration::from_secs(60)), None);
}

#[test]
fn serializes_with_the_field_names_the_service_uses() {
    let mut p = NodeProbe::new("dls.example", 443);
    p.steps.push(Step {
        name: StepName::Tcp,
        ok: false,
        detail: "connection refused".into(),
        elapsed_ms: 1,
    });
    p.clock_skew_seconds = Some(1.5);
    let v = serde_json::to_value(&p).unwrap();
    assert_eq!(v["steps"][0]["name"], "tcp");
    assert_eq!(v["clock_skew_seconds"], 1.5);
    let back: NodeProbe = serde_json::from_value(v).unwrap();
    assert_eq!(back, p);
}

#[test]
fn heads_hosts_and_targets() {
    assert_eq!(
        parse_head(b"HTTP/1.1 200 OK\r\nServer: x\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n"),
        Ok((
            200,
            "OK".into(),
            Some("Sun, 06 Nov 1994 08:49:37 GMT".into())
        ))
    );
    assert_eq!(
        parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").map(rfc3339),
        Some("1994-11-06T08:49:37Z".into())
    );
    assert!(parse_head(b"SSH-2.0-OpenSSH\r\n").is_err());
    assert_eq!(bare_host("https://dls.example/"), "dls.example");
    assert_eq!(bare_host("[fd00::5]"), "fd00::5");
    assert_eq!(endpoint("fd00::5", 443), "[fd00::5]:443");
    assert_eq!(skew_words(312.4), "312 s ahead of");
    assert_eq!(skew_words(-4.24), "4.2 s behind");
    let token = crate::token::Token {
        algorithm: None,
        issuer: None,
        audience: None,
        token_id: None,
        issued_at: None,
        not_before: None,
        expires: None,
        instance_ref: None,
        scope_refs: vec![],
        nodes: vec![
            crate::token::DlsNode {
                host: "a".into(),
                auth_port: 443,
                lease_port: 443,
            },
            crate::token::DlsNode {
                host: "b".into(),
                auth_port: 8082,
                lease_port: 443,
            },
        ],
    };
    assert_eq!(
        targets(&token),
        vec![("a".into(), 443), ("b".into(), 443), ("b".into(), 8082)]
    );
}

#[test]
fn names_are_written_as_rfc_4514_without_an_oid_database() {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["dls.example".to_string()]).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CountryName, "US");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "Example, Inc.");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "dls.example");
    params
        .distinguished_name
        .push(rcgen::DnType::CustomDnType(vec![2, 5, 4, 97]), "VATDE-123");
    let cert = params.self_signed(&key).unwrap();
    let info = cert_info(&[CertificateDer::from(cert.der().to_vec())]).unwrap();
    assert_eq!(
        info.subject,
        "2.5.4.97=VATDE-123,CN=dls.example,O=Example\\, Inc.,C=US"
    );
    assert_eq!(info.subject, info.issuer);
    assert!(cert_info(&[CertificateDer::from(vec![0x30, 0x03, 1, 2, 3])]).is_err());
    assert!(cert_info(&[]).is_err());
}

/// A reverse proxy in front of a DLS that is down answers for it: 502, 503 or 504 is the
/// proxy's word that the DLS did not answer, not proof that the path works.
#[test]
fn a_gateway_error_fails_the_https_step() {
    for status in [
        "502 Bad Gateway",
        "503 Service Unavailable",
        "504 Gateway Timeout",
    ] {
        let port = tls_dls(Answer::Status(status));
        let p = probe_node("localhost", port, T);
        assert_eq!(
            names(&p),
            [
                (StepName::Dns, true),
                (StepName::Tcp, true),
                (StepName::Tls, true),
                (StepName::Https, false)
            ],
            "{p:#?}"
        );
        assert!(p.steps[3].detail.contains("in front of the DLS"), "{p:#?}");
        assert_eq!(p.clock_skew_seconds, None);
        assert_eq!(
            verdict(&[p], Duration::from_secs(60)).map(|v| v.0),
            Some(Reason::DlsUnreachable)
        );
    }
}
