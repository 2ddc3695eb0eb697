//! The agent's HTTP client: rustls with the ring provider, the system's roots (plus a
//! private CA where one is given), at most five redirects and never to plain HTTP, and URLs
//! shown without their user, password and query, which may carry credentials. Used to
//! download a token (`install --token-url`) and to POST the report (the service's webhook).

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail};
use reqwest::redirect::Policy;
use reqwest::{Client, Url};

use crate::input::{self, Links};
use crate::text::show_path;

/// A CA bundle larger than this is not one (the whole Mozilla store is about 200 KB).
const MAX_CA_BYTES: usize = 4 << 20;

/// The URL as it may be shown: scheme, host, port and path; never user, password or query.
pub fn redact(url: &Url) -> String {
    let mut shown = format!("{}://{}", url.scheme(), url.host_str().unwrap_or(""));
    if let Some(port) = url.port() {
        shown.push_str(&format!(":{port}"));
    }
    shown.push_str(url.path());
    if url.query().is_some() {
        shown.push_str("?...");
    }
    shown
}

fn is_loopback(url: &Url) -> bool {
    let host = url.host_str().unwrap_or("");
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

pub fn allowed(url: &Url) -> bool {
    url.scheme() == "https" || (url.scheme() == "http" && is_loopback(url))
}

/// An error and its causes on one line, with no URL in it.
pub fn chain(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut parts = vec![e.to_string()];
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ").replace('\n', " ")
}

pub fn client(url: &Url, ca_file: Option<&Path>, timeout: Duration) -> anyhow::Result<Client> {
    // reqwest is built without a default provider: ring needs no C toolchain beyond cc.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let base = || {
        Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!("vgpu-license-agent/", env!("CARGO_PKG_VERSION")))
            .redirect(Policy::custom(|attempt| {
                if attempt.previous().len() >= 5 {
                    attempt.error("more than 5 redirects")
                } else if allowed(attempt.url()) {
                    attempt.follow()
                } else {
                    attempt.error("redirected to a plain-HTTP URL (refused: the token is a secret)")
                }
            }))
    };
    let certs = match ca_file {
        None => Vec::new(),
        Some(path) => {
            let pem = input::read_file(path, MAX_CA_BYTES, Links::Follow).map_err(|e| {
                anyhow!(
                    "cannot read --ca-file {}: {e}; give the PEM file of the CA that signed the server's certificate",
                    show_path(path)
                )
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|_| {
                anyhow!(
                    "--ca-file {} is not a PEM certificate bundle; give the CA certificate in PEM form (-----BEGIN CERTIFICATE-----)",
                    show_path(path)
                )
            })?;
            if certs.is_empty() {
                bail!(
                    "--ca-file {} holds no certificate; give the CA certificate in PEM form (-----BEGIN CERTIFICATE-----)",
                    show_path(path)
                );
            }
            certs
        }
    };
    let built = if url.scheme() == "http" {
        // Loopback only: no certificate is ever checked, so no trust store is needed.
        base().tls_certs_only(certs).build()
    } else if certs.is_empty() {
        base().build()
    } else {
        base()
            .tls_certs_merge(certs.clone())
            .build()
            .or_else(|_| base().tls_certs_only(certs).build())
    };
    built.map_err(|e| {
        anyhow!(
            "cannot set up HTTPS: {}; install the ca-certificates package, or give --ca-file",
            chain(e)
        )
    })
}

/// Runs `fut` to its end on a runtime of its own (the commands other than `run` have none).
pub fn block_on<F: Future>(fut: F) -> anyhow::Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow!("cannot start the HTTP client: {e}"))?;
    Ok(rt.block_on(fut))
}

/// POSTs a JSON body (the service's webhook): HTTPS with the system's roots, verified, the
/// whole exchange within `timeout`.
pub async fn post_json(url: &str, body: Vec<u8>, timeout: Duration) -> anyhow::Result<()> {
    let parsed = Url::parse(url).map_err(|_| anyhow!("webhook_url is not a URL"))?;
    let shown = redact(&parsed);
    let client = client(&parsed, None, timeout)?;
    let send = client
        .post(parsed)
        .header("Content-Type", "application/json")
        .body(body)
        .send();
    let resp = match tokio::time::timeout(timeout, send).await {
        Ok(r) => r.map_err(|e| anyhow!("POST {shown}: {}", chain(e)))?,
        Err(_) => bail!("POST {shown}: no answer within {} s", timeout.as_secs()),
    };
    if !resp.status().is_success() {
        return Err(anyhow!("POST {shown}: HTTP {}", resp.status()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    const SECRET_URL: &str = "http://hook-user:hunter2@127.0.0.1:{port}/alert?token=s3cr3t";

    fn url(port: u16) -> String {
        SECRET_URL.replace("{port}", &port.to_string())
    }

    fn assert_no_secret(err: &str) {
        assert!(
            !err.contains("hunter2") && !err.contains("s3cr3t") && !err.contains("hook-user"),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }

    fn post(url: &str) -> String {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(post_json(url, b"{}".to_vec(), Duration::from_secs(2)))
            .unwrap_err()
            .to_string()
    }

    /// A webhook that fails, however it fails, is logged without its credentials or query.
    #[test]
    fn a_failed_webhook_never_shows_its_credentials() {
        // Refused.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let err = post(&url(port));
        assert!(err.contains("POST http://127.0.0.1"), "{err}");
        assert_no_secret(&err);

        // Answered with an error status; and silent.
        for answer in [
            Some(&b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"[..]),
            None,
        ] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let server = std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                match answer {
                    Some(a) => s.write_all(a).unwrap(),
                    None => std::thread::sleep(Duration::from_secs(4)),
                }
            });
            let err = post(&url(port));
            match answer {
                Some(_) => assert!(err.contains("HTTP 500"), "{err}"),
                None => assert!(
                    err.contains("timed out") || err.contains("no answer within 2 s"),
                    "{err}"
                ),
            }
            assert_no_secret(&err);
            server.join().unwrap();
        }

        // Not a URL at all: the text is not repeated.
        let err = post("hunter2 s3cr3t");
        assert_eq!(err, "webhook_url is not a URL");
    }
}
