//! `--token-url`: download the token over HTTPS (rustls with the ring provider, the system's
//! roots plus `--ca-file`), with a time limit on each whole attempt (connect, headers and
//! body: a server that trickles its answer cannot hold cloud-init) and retries with backoff.
//! Plain HTTP is accepted from the loopback only (a local proxy or metadata relay). URLs are
//! shown without their user, password and query, which may carry credentials.

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
fn block_on<F: Future>(fut: F) -> anyhow::Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow!("cannot start the HTTP client: {e}"))?;
    Ok(rt.block_on(fut))
}

/// How one attempt ended.
enum Attempt {
    Done(Vec<u8>),
    /// Worth another attempt: the reason.
    Retry(String),
    /// Not worth another: the whole message.
    Fail(anyhow::Error),
}

/// One GET of the token: connect, headers and body, all within `timeout`.
async fn attempt(client: &Client, url: &Url, shown: &str, timeout: Duration) -> Attempt {
    let whole = async {
        let mut resp = match client.get(url.clone()).send().await {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(chain(e)),
        };
        let status = resp.status();
        if !status.is_success() {
            let code = status.as_u16();
            let last = format!("the server answered HTTP {status}");
            if status.is_server_error() || code == 408 || code == 429 {
                return Attempt::Retry(last);
            }
            let hint = match code {
                401 | 403 => "check the credentials the URL needs",
                404 | 410 => "check the URL",
                _ => "check the URL and the server",
            };
            return Attempt::Fail(anyhow!(
                "cannot download the token from {shown}: {last}; {hint}"
            ));
        }
        let mut body = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > crate::token::MAX_TOKEN_BYTES {
                        return Attempt::Fail(anyhow!(
                            "the download from {shown} is larger than {} bytes, far more than a client configuration token (a few KB); check that the URL serves the .tok file",
                            crate::token::MAX_TOKEN_BYTES
                        ));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => return Attempt::Done(body),
                Err(e) => return Attempt::Retry(format!("the download broke off: {}", chain(e))),
            }
        }
    };
    match tokio::time::timeout(timeout, whole).await {
        Ok(a) => a,
        Err(_) => Attempt::Retry(format!(
            "no whole answer within the time limit of {} s (--timeout)",
            timeout.as_secs()
        )),
    }
}

/// Downloads the token, retrying `retries` times on network errors, on an attempt that ran
/// past `timeout`, and on HTTP 408, 429 and 5xx, waiting 1 s, 2 s, 4 s, then 8 s between
/// attempts.
pub fn fetch(
    url: &str,
    ca_file: Option<&Path>,
    timeout: Duration,
    retries: u32,
) -> anyhow::Result<Vec<u8>> {
    let url = Url::parse(url.trim()).map_err(|e| {
        anyhow!(
            "--token-url is not a valid URL ({}); give an https:// URL of the token file",
            crate::text::escape(&e.to_string())
        )
    })?;
    let shown = redact(&url);
    if !allowed(&url) {
        bail!(
            "--token-url {shown}: only https:// is accepted (plain http only from the loopback): the token is a secret; serve it over HTTPS"
        );
    }
    let client = client(&url, ca_file, timeout)?;
    block_on(async {
        let mut wait = Duration::from_secs(1);
        let mut last = String::new();
        for n in 0..=retries {
            if n > 0 {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(8));
            }
            match attempt(&client, &url, &shown, timeout).await {
                Attempt::Done(bytes) => return Ok(bytes),
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry(why) => last = why,
            }
        }
        bail!(
            "cannot download the token from {shown} after {} attempt(s): {last}; check the URL, the network and the server's certificate (--ca-file for a private CA)",
            retries + 1
        )
    })?
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
