//! The agent's HTTP client: rustls with the ring provider, the system's roots (plus a
//! private CA where one is given), and URLs shown without their user, password and query,
//! which may carry credentials. Used to download a token (`install --token-url`) and to POST
//! the report (the service's webhook).
//!
//! What it trusts, in one place:
//! - redirects are followed by [`get_following`] alone, at most five, never from HTTPS to
//!   plain HTTP, and a credential (the URL's user and password) goes only to the host it was
//!   given for: once a redirect leaves that host, no later hop carries it, even one that
//!   comes back. The client itself follows none; the Kubernetes API's follows none either
//!   (an API server never redirects);
//! - every body the agent reads is capped ([`body_capped`]): an answer that does not end, or
//!   is larger than what is asked for could be, is cut and refused, never held whole.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail};
use reqwest::redirect::Policy;
use reqwest::{Client, Url};

use crate::files::input::{self, Links};
use crate::model::text::show_path;

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

// The rules for a URL or an address in the config are the model's, kept under their names.
pub use vgpu_license_model::config::{Listen, allowed, listen_address, webhook_url};

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

/// A server certificate the client refused, in the operator's words: what is wrong with it
/// and what to do, on one line; `None` where `e` is no certificate's refusal. `host`: the
/// server's, as the URL names it; `ca_file`: the `--ca-file` given, if any.
pub fn certificate_problem(
    e: &reqwest::Error,
    host: &str,
    ca_file: Option<&Path>,
) -> Option<String> {
    let refused = refused_certificate(e)?;
    Some(describe_certificate(refused, host, ca_file))
}

/// The certificate error in `e`'s causes. An `io::Error` holds its own error (rustls' in
/// tokio-rustls' in hyper's), which its `source()` skips.
fn refused_certificate<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::CertificateError> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(rustls::Error::InvalidCertificate(ce)) = c.downcast_ref::<rustls::Error>() {
            return Some(ce);
        }
        cause = match c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => c.source(),
        };
    }
    None
}

fn describe_certificate(
    c: &rustls::CertificateError,
    host: &str,
    ca_file: Option<&Path>,
) -> String {
    use rustls::CertificateError as C;
    let trusted = match ca_file {
        Some(p) => format!("the CA in --ca-file {}", show_path(p)),
        None => "a CA this guest trusts (the system's CA certificates)".into(),
    };
    match c {
        C::Other(o) if format!("{o:?}").contains("CaUsedAsEndEntity") => format!(
            "{host} presents a CA certificate as its own (a self-signed certificate made as a CA, as `openssl req -x509` makes one), which is never accepted as a server's, also when given as --ca-file: give --ca-file the CA that signed the server's certificate, or have the server present a certificate for {host} signed by a CA and give that CA"
        ),
        C::UnknownIssuer => format!(
            "the certificate {host} presents is not signed by {trusted}: give --ca-file the PEM certificate of the CA that signed it (its issuer), not the server's own certificate"
        ),
        C::Expired | C::ExpiredContext { .. } => format!(
            "the certificate {host} presents has expired: renew it on the server (if it has not expired, set this guest's clock right)"
        ),
        C::NotValidYet | C::NotValidYetContext { .. } => format!(
            "the certificate {host} presents is not valid yet: set this guest's clock right (or the certificate's dates on the server)"
        ),
        C::NotValidForName => format!(
            "the certificate {host} presents is not made out to {host}: use a host name it names in the URL, or give the server a certificate for {host}"
        ),
        C::NotValidForNameContext { presented, .. } => format!(
            "the certificate {host} presents is not made out to {host} but to {}: use one of those names in the URL, or give the server a certificate for {host}",
            presented
                .iter()
                .map(|n| bare_name(n))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        C::Revoked => format!(
            "the certificate {host} presents has been revoked: install a new certificate on the server"
        ),
        other => format!(
            "the certificate {host} presents was refused ({}): check the server's certificate, and that --ca-file is the CA that signed it",
            rustls::Error::InvalidCertificate(other.clone())
        ),
    }
}

/// A name a certificate presents, as rustls gives it (`DnsName("localhost")`), bare.
fn bare_name(n: &str) -> &str {
    n.split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .map_or(n, |inner| inner.trim_matches('"'))
}

pub fn client(url: &Url, ca_file: Option<&Path>, timeout: Duration) -> anyhow::Result<Client> {
    // reqwest is built without a default provider: ring needs no C toolchain beyond cc.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let base = || {
        Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!("vgpu-license-agent/", env!("CARGO_PKG_VERSION")))
            // Redirects are followed by get_following, which knows whose credentials go where;
            // the webhook follows none.
            .redirect(Policy::none())
    };
    let certs = match ca_file {
        None => Vec::new(),
        Some(path) => ca_certs(path)?,
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

/// The certificates of `--ca-file`: a PEM bundle of at least one.
fn ca_certs(path: &Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
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
    Ok(certs)
}

/// The most redirects [`get_following`] follows.
const MAX_REDIRECTS: usize = 5;

/// Whether two URLs are the same origin: scheme, host and port.
fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// `url` without its user and password.
fn without_credentials(url: &Url) -> Url {
    let mut bare = url.clone();
    let _ = bare.set_username("");
    let _ = bare.set_password(None);
    bare
}

/// Why [`get_following`] stopped without an answer to read.
#[derive(Debug)]
pub enum GetError {
    /// The request itself failed (connect, TLS, timeout).
    Send(reqwest::Error),
    /// A redirect the agent refuses: why, and the URL it pointed to (shown redacted).
    Refused(String),
}

/// GETs `url`, following redirects by the agent's rule: at most [`MAX_REDIRECTS`], each
/// to a URL [`allowed`] takes and never from HTTPS to plain HTTP, and the URL's user and
/// password sent (as Basic credentials) only while every hop so far stayed on the first
/// URL's origin. A redirect's own user and password are never used. Returns the first answer
/// that is not a redirect.
pub async fn get_following(client: &Client, url: &Url) -> Result<reqwest::Response, GetError> {
    let credentials = (!url.username().is_empty())
        .then(|| (url.username().to_string(), url.password().map(String::from)));
    let first = without_credentials(url);
    let mut at = first.clone();
    let mut on_first_host = true;
    for hop in 0..=MAX_REDIRECTS {
        let mut request = client.get(at.clone());
        if let (true, Some((user, password))) = (on_first_host, &credentials) {
            request = request.basic_auth(
                percent_decoded(user),
                password.as_deref().map(percent_decoded),
            );
        }
        let resp = request.send().await.map_err(GetError::Send)?;
        let Some(location) = redirect_target(&resp) else {
            return Ok(resp);
        };
        if hop == MAX_REDIRECTS {
            break;
        }
        let next = at
            .join(&location)
            .map_err(|_| GetError::Refused("redirected to something that is not a URL".into()))?;
        if !allowed(&next) || (at.scheme() == "https" && next.scheme() != "https") {
            return Err(GetError::Refused(format!(
                "redirected from {} to {}, which is not HTTPS (refused: the token is a secret)",
                redact(&at),
                redact(&next)
            )));
        }
        let next = without_credentials(&next);
        on_first_host = on_first_host && same_origin(&next, &first);
        at = next;
    }
    Err(GetError::Refused(format!(
        "more than {MAX_REDIRECTS} redirects"
    )))
}

/// The URL's user or password as it was meant: a URL holds them percent-encoded.
fn percent_decoded(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Where a redirect answer points: its `Location`, on a 301, 302, 303, 307 or 308.
fn redirect_target(resp: &reqwest::Response) -> Option<String> {
    let code = resp.status().as_u16();
    if !matches!(code, 301 | 302 | 303 | 307 | 308) {
        return None;
    }
    resp.headers()
        .get(reqwest::header::LOCATION)?
        .to_str()
        .ok()
        .map(String::from)
}

/// Why [`body_capped`] has no body to give.
#[derive(Debug)]
pub enum BodyError {
    /// More than the cap came: the answer is refused, what came so far dropped.
    TooLarge,
    /// The body broke off (or timed out).
    Broken(reqwest::Error),
}

/// Reads a response's body, at most `max` bytes: every body the agent reads goes through
/// here, so that an answer without end never grows the agent.
pub async fn body_capped(resp: &mut reqwest::Response, max: usize) -> Result<Vec<u8>, BodyError> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Broken)? {
        if body.len() + chunk.len() > max {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
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
    // Judged again here: a config loaded by an older agent, or edited under a running one,
    // never sends the report in clear to another host.
    let parsed = webhook_url(url).map_err(|e| anyhow!(e))?;
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

    /// Plain HTTP goes to the loopback only, as the URL parses: a user name, a longer host
    /// name or a subdomain that starts like a loopback address is another host.
    #[test]
    fn plain_http_is_judged_by_the_parsed_host() {
        for url in [
            "http://localhost@webhook.example.com/",
            "http://127.0.0.1.webhook.example.com/",
            "http://localhost.example.com/",
            "http://127.0.0.1@10.0.0.5/",
            "http://[::ffff:10.0.0.5]/",
            "http://10.0.0.5/hook",
            "ftp://localhost/x",
            "localhost:80",
        ] {
            let e = webhook_url(url).unwrap_err();
            assert!(e.starts_with("service.webhook_url"), "{url}: {e}");
            assert!(!e.contains("example") && !e.contains("10.0.0.5"), "{e}");
        }
        for url in [
            "http://127.0.0.1:9/",
            "http://127.1.2.3/hook",
            "http://localhost:8080/hook",
            "http://LOCALHOST/hook",
            "http://[::1]:9/",
            "http://user:pw@127.0.0.1/hook",
            "https://webhook.example.com/",
            "https://localhost@webhook.example.com/",
        ] {
            assert!(webhook_url(url).is_ok(), "{url}");
        }
    }

    /// Before each POST too: a URL that reached the service unjudged never goes out.
    #[test]
    fn a_plain_http_webhook_to_another_host_is_never_posted() {
        for url in [
            "http://localhost@webhook.example.com/",
            "http://127.0.0.1.webhook.example.com/",
            "http://localhost.example.com/",
        ] {
            let err = post(url);
            assert!(
                err.starts_with("service.webhook_url: expected an https:// URL"),
                "{url}: {err}"
            );
        }
        // The loopback is tried (nothing listens on the discard port here).
        let err = post("http://127.0.0.1:9/");
        assert!(err.starts_with("POST http://127.0.0.1:9/"), "{err}");
    }

    #[test]
    fn a_listen_address_is_an_address_and_port_or_a_port_alone() {
        assert_eq!(listen_address(":9841"), Some(Listen::Any(9841)));
        assert_eq!(
            listen_address("127.0.0.1:9841"),
            Some(Listen::At("127.0.0.1:9841".parse().unwrap()))
        );
        assert_eq!(
            listen_address("[::]:9841"),
            Some(Listen::At("[::]:9841".parse().unwrap()))
        );
        for bad in [":", ":+1", ":65536", ": 9841", "9841", "localhost:9841", ""] {
            assert_eq!(listen_address(bad), None, "{bad:?}");
        }
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
        assert_eq!(
            err,
            "service.webhook_url is not a URL; give an https:// URL"
        );
    }
}
