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
    let token = crate::model::token::Token {
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
            crate::model::token::DlsNode {
                host: "a".into(),
                auth_port: 443,
                lease_port: 443,
            },
            crate::model::token::DlsNode {
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

/// Whatever a server, a proxy or a certificate holds: read or refused, never a panic, and
/// nothing read grows past what came in.
mod arbitrary_input {
    use std::net::TcpStream;
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;

    /// Pieces of response heads, so that random heads reach past the status line.
    const HEAD_PIECES: &[&str] = &[
        "HTTP/1.1 ",
        "HTTP/1.0 ",
        "HTTP/",
        "HTTP/2 200",
        "200",
        "407",
        "502",
        "65535",
        "65536",
        "-1",
        "+200",
        " OK",
        " Proxy Authentication Required",
        " ",
        "\r\n",
        "\n",
        "\r",
        "\r\n\r\n",
        "Date: ",
        "date:",
        " DATE :",
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "Sat, 01 Jan 0000 00:00:00 GMT",
        "31 Dec 262143 23:59:59 +2359",
        "Mon, 32 Feb 2024 25:61:61 -9999",
        ":",
        "\u{1b}[2J",
        "\u{202e}",
        "\u{fffd}",
        "\0",
    ];

    fn head_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..1024),
            prop::collection::vec(
                prop_oneof![
                    3 => prop::sample::select(HEAD_PIECES).prop_map(|p| p.as_bytes().to_vec()),
                    1 => prop::collection::vec(any::<u8>(), 0..8),
                ],
                0..32,
            )
            .prop_map(|v| v.concat()),
        ]
    }

    /// How the probe uses a `Date` it read: the skew against now, and the time shown.
    fn use_date(t: DateTime<Utc>) {
        let _ = rfc3339(t);
        let half = chrono::Duration::from_std(Duration::from_secs(3600)).unwrap_or_default();
        let skew = ((Utc::now() + half) - t).as_seconds_f64() - 0.5;
        assert!(skew.is_finite(), "{t:?}");
        let _ = skew_words((skew * 1000.0).round() / 1000.0);
    }

    /// A message for a person: one line, control characters shown as `?`.
    fn one_line(s: &str) -> bool {
        !s.chars().any(char::is_control)
    }

    /// A proxy that reads the `CONNECT` request, answers `answer` and closes.
    fn proxy_answering(answer: Vec<u8>) -> TcpStream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(&answer);
        });
        TcpStream::connect(addr).unwrap()
    }

    /// A real certificate's DER, made once.
    fn certificate() -> &'static [u8] {
        static DER: OnceLock<Vec<u8>> = OnceLock::new();
        DER.get_or_init(|| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params =
                rcgen::CertificateParams::new(vec!["dls.example".to_string()]).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "dls.example");
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, "Example, Inc.");
            params.self_signed(&key).unwrap().der().to_vec()
        })
    }

    #[test]
    fn a_proxy_head_that_never_ends_is_cut_at_the_bound() {
        let mut sock = proxy_answering(vec![b'x'; MAX_HEAD + 4096]);
        let deadline = Instant::now() + Duration::from_secs(10);
        match tunnel(&mut sock, "dls.example", 443, deadline) {
            Err(Tunnel::Broken(e)) => assert!(e.contains("too long"), "{e}"),
            Ok(s) | Err(Tunnel::Refused(_, s)) => panic!("{s}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_response_head_is_read_or_refused(head in head_bytes()) {
            match parse_head(&head) {
                Ok((_, reason, date)) => {
                    prop_assert!(head.starts_with(b"HTTP/"));
                    // Only the head before its blank line is read.
                    let end = http::find(&head, b"\r\n\r\n").unwrap_or(head.len());
                    let read = reason.len() + date.as_ref().map_or(0, String::len);
                    prop_assert!(read <= 3 * end, "{read} bytes from {end}");
                    if let Some(t) = date.as_deref().and_then(parse_http_date) {
                        use_date(t);
                    }
                }
                Err(e) => {
                    prop_assert!(one_line(&e), "{e:?}");
                    // At most 60 characters of the line, each escaped in at most 10.
                    prop_assert!(e.len() <= 30 + 60 * 10, "{e:?}");
                }
            }
        }

        #[test]
        fn any_date_is_read_or_refused(
            s in prop_oneof![
                any::<String>(),
                prop::collection::vec(prop::sample::select(HEAD_PIECES), 0..6)
                    .prop_map(|v| v.concat()),
            ],
        ) {
            if let Some(t) = parse_http_date(&s) {
                use_date(t);
            }
        }

        /// A `Date` as RFC 7231 writes it (IMF-fixdate) reads back as the same time.
        #[test]
        fn an_http_date_reads_back_as_the_same_time(
            secs in -62_135_596_800i64..253_402_300_800,
            name in prop::sample::select(&["Date", "date", "DATE", " Date "][..]),
            before in prop::collection::vec("[A-Za-z-]{1,12}: [ -~]{0,20}", 0..4),
        ) {
            let t = DateTime::from_timestamp(secs, 0).unwrap();
            let mut head = String::from("HTTP/1.1 404 Not Found\r\n");
            for h in before.iter().filter(|h| !h.to_ascii_lowercase().starts_with("date")) {
                head.push_str(h);
                head.push_str("\r\n");
            }
            head.push_str(&format!("{name}: {}\r\n\r\n", http_date(t)));
            let (code, reason, date) = parse_head(head.as_bytes()).unwrap();
            prop_assert_eq!((code, reason.as_str()), (404, "Not Found"));
            let date = date.unwrap();
            prop_assert_eq!(parse_http_date(&date), Some(t), "{}", date);
        }

        #[test]
        fn any_skew_gives_a_verdict(
            skews in prop::collection::vec(
                prop::option::of(prop_oneof![any::<f64>(), -1e6f64..1e6]),
                0..6,
            ),
            reachable in any::<bool>(),
            max in 0u64..(366 * 86_400),
        ) {
            let probes: Vec<NodeProbe> = skews
                .iter()
                .enumerate()
                .map(|(i, skew)| {
                    let mut p = NodeProbe::new(&format!("dls{i}.example"), 443);
                    p.steps.push(Step {
                        name: StepName::Https,
                        ok: reachable,
                        detail: "HTTP 404".into(),
                        elapsed_ms: 1,
                    });
                    p.clock_skew_seconds = *skew;
                    p
                })
                .collect();
            let _ = clock_skew(&probes);
            if let Some((_, message)) = verdict(&probes, Duration::from_secs(max)) {
                prop_assert!(!message.contains('\n'), "{message}");
            }
            for s in skews.iter().flatten() {
                let _ = skew_words(*s);
            }
        }

        #[test]
        fn any_host_is_cut_to_a_part_of_itself(host in any::<String>(), port in any::<u16>()) {
            let bare = bare_host(&host);
            prop_assert!(host.contains(bare));
            let _ = endpoint(bare, port);
        }

        /// Any bytes as the server's certificate, random or a real one damaged.
        #[test]
        fn any_certificate_is_described_or_refused(
            der in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..512),
                prop::collection::vec((any::<usize>(), any::<u8>()), 0..8).prop_map(|changes| {
                    let mut der = certificate().to_vec();
                    for (at, b) in changes {
                        let n = der.len();
                        der[at % n] = b;
                    }
                    der
                }),
                (any::<usize>()).prop_map(|cut| {
                    let der = certificate();
                    der[..cut % der.len()].to_vec()
                }),
            ],
        ) {
            match cert_info(&[CertificateDer::from(der)]) {
                Ok(c) => {
                    prop_assert!(one_line(&c.subject) && one_line(&c.issuer), "{c:?}");
                    let _ = c.valid_at(Utc::now());
                }
                Err(e) => prop_assert!(!e.contains('\n'), "{e}"),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever a proxy answers to `CONNECT`: a tunnel only on 2xx, its status shown
        /// on one line.
        #[test]
        fn any_proxy_answer_is_a_tunnel_a_refusal_or_broken(answer in head_bytes()) {
            let mut sock = proxy_answering(answer);
            let deadline = Instant::now() + Duration::from_secs(10);
            match tunnel(&mut sock, "dls.example", 443, deadline) {
                Ok(status) => {
                    prop_assert!(status.starts_with("HTTP 2"), "{status}");
                    prop_assert!(one_line(&status), "{status:?}");
                }
                Err(Tunnel::Refused(code, status)) => {
                    prop_assert!(!(200..300).contains(&code));
                    prop_assert!(one_line(&status), "{status:?}");
                }
                Err(Tunnel::Broken(e)) => prop_assert!(one_line(&e), "{e:?}"),
            }
        }
    }
}
