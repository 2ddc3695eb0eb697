//! `--token-url`: download the token over HTTPS (rustls with the ring provider, the system's
//! roots plus `--ca-file`), with a time limit per attempt and retries with backoff. Plain
//! HTTP is accepted from the loopback only (a local proxy or metadata relay). URLs are shown
//! without their user, password and query, which may carry credentials.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail};
use reqwest::Url;
use reqwest::blocking::Client;
use reqwest::redirect::Policy;

use super::source::read_capped;

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

fn allowed(url: &Url) -> bool {
    url.scheme() == "https" || (url.scheme() == "http" && is_loopback(url))
}

/// An error and its causes on one line, with no URL in it.
fn chain(e: reqwest::Error) -> String {
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

fn client(url: &Url, ca_file: Option<&Path>, timeout: Duration) -> anyhow::Result<Client> {
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
            let pem = std::fs::read(path).map_err(|e| {
                anyhow!(
                    "cannot read --ca-file {}: {e}; give the PEM file of the CA that signed the server's certificate",
                    path.display()
                )
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|_| {
                anyhow!(
                    "--ca-file {} is not a PEM certificate bundle; give the CA certificate in PEM form (-----BEGIN CERTIFICATE-----)",
                    path.display()
                )
            })?;
            if certs.is_empty() {
                bail!(
                    "--ca-file {} holds no certificate; give the CA certificate in PEM form (-----BEGIN CERTIFICATE-----)",
                    path.display()
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

/// Downloads the token, retrying `retries` times on network errors and on HTTP 408, 429 and
/// 5xx, waiting 1 s, 2 s, 4 s, then 8 s between attempts.
pub fn fetch(
    url: &str,
    ca_file: Option<&Path>,
    timeout: Duration,
    retries: u32,
) -> anyhow::Result<Vec<u8>> {
    let url = Url::parse(url.trim()).map_err(|e| {
        anyhow!("--token-url is not a valid URL ({e}); give an https:// URL of the token file")
    })?;
    let shown = redact(&url);
    if !allowed(&url) {
        bail!(
            "--token-url {shown}: only https:// is accepted (plain http only from the loopback): the token is a secret; serve it over HTTPS"
        );
    }
    let client = client(&url, ca_file, timeout)?;
    let mut wait = Duration::from_secs(1);
    let mut last = String::new();
    for attempt in 0..=retries {
        if attempt > 0 {
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(8));
        }
        match client.get(url.clone()).send() {
            Ok(resp) => {
                let status = resp.status();
                if status.is_success() {
                    match read_capped(resp) {
                        Ok(Ok(bytes)) => return Ok(bytes),
                        Ok(Err(_too_large)) => bail!(
                            "the download from {shown} is larger than {} bytes, far more than a client configuration token (a few KB); check that the URL serves the .tok file",
                            crate::token::MAX_TOKEN_BYTES
                        ),
                        Err(e) => {
                            last = format!("the download broke off: {e}");
                            continue;
                        }
                    }
                }
                let code = status.as_u16();
                last = format!("the server answered HTTP {status}");
                if !(status.is_server_error() || code == 408 || code == 429) {
                    let hint = match code {
                        401 | 403 => "check the credentials the URL needs",
                        404 | 410 => "check the URL",
                        _ => "check the URL and the server",
                    };
                    bail!("cannot download the token from {shown}: {last}; {hint}");
                }
            }
            Err(e) => last = chain(e),
        }
    }
    bail!(
        "cannot download the token from {shown} after {} attempt(s): {last}; check the URL, the network and the server's certificate (--ca-file for a private CA)",
        retries + 1
    )
}

/// POSTs a JSON body (the service's webhook): HTTPS with the system's roots, verified.
pub fn post_json(url: &str, body: Vec<u8>, timeout: Duration) -> anyhow::Result<()> {
    let parsed = Url::parse(url).map_err(|e| anyhow!("{url:?} is not a URL: {e}"))?;
    let shown = redact(&parsed);
    let resp = client(&parsed, None, timeout)?
        .post(parsed)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .map_err(|e| anyhow!("POST {shown}: {}", chain(e)))?;
    if !resp.status().is_success() {
        return Err(anyhow!("POST {shown}: HTTP {}", resp.status()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_credentials_and_query() {
        let u = Url::parse("https://user:s3cret@host.example:8443/t/x.tok?sig=abc#f").unwrap();
        assert_eq!(redact(&u), "https://host.example:8443/t/x.tok?...");
        assert!(allowed(&u));
        assert!(allowed(&Url::parse("http://127.0.0.1:1/x").unwrap()));
        assert!(allowed(&Url::parse("http://[::1]:1/x").unwrap()));
        assert!(!allowed(&Url::parse("http://10.0.0.5/x").unwrap()));
        assert!(!allowed(&Url::parse("ftp://localhost/x").unwrap()));
    }

    #[test]
    fn plain_http_to_a_remote_host_is_refused_without_connecting() {
        let e = fetch(
            "http://user:pw@dls.example/x.tok",
            None,
            Duration::from_secs(1),
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("only https://") && !e.contains("pw"), "{e}");
    }
}
