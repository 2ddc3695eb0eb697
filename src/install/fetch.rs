//! `--token-url`: download the token over HTTPS with the agent's client ([`crate::http`]),
//! with a time limit on each whole attempt (connect, headers and body: a server that
//! trickles its answer cannot hold cloud-init) and retries with backoff. Plain HTTP is
//! accepted from the loopback only (a local proxy or metadata relay).

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail};
use reqwest::{Client, Url};

use crate::http::{
    BodyError, GetError, allowed, block_on, body_capped, certificate_problem, chain, client,
    get_following, redact,
};

/// How one attempt ended.
enum Attempt {
    Done(Vec<u8>),
    /// Worth another attempt: the reason.
    Retry(String),
    /// Not worth another: the whole message.
    Fail(anyhow::Error),
}

/// One GET of the token: connect, headers and body, all within `timeout`.
async fn attempt(
    client: &Client,
    url: &Url,
    shown: &str,
    timeout: Duration,
    ca_file: Option<&Path>,
) -> Attempt {
    let whole = async {
        let mut resp = match get_following(client, url).await {
            Ok(r) => r,
            Err(GetError::Send(e)) if e.is_timeout() => return Attempt::Retry(too_slow(timeout)),
            // A refused certificate is the same at the next attempt: said at once, in words.
            Err(GetError::Send(e))
                if let Some(why) =
                    certificate_problem(&e, url.host_str().unwrap_or_default(), ca_file) =>
            {
                return Attempt::Fail(anyhow!("cannot download the token from {shown}: {why}"));
            }
            Err(GetError::Send(e)) => return Attempt::Retry(chain(e)),
            Err(GetError::Refused(why)) => {
                return Attempt::Fail(anyhow!(
                    "cannot download the token from {shown}: {why}; serve the token over HTTPS from a URL that needs no redirect to plain HTTP"
                ));
            }
        };
        if let Some(refused) = refused_status(resp.status(), shown) {
            return refused;
        }
        match body_capped(&mut resp, crate::model::token::MAX_TOKEN_BYTES).await {
            Ok(body) => Attempt::Done(body),
            Err(BodyError::TooLarge) => Attempt::Fail(anyhow!(
                "the download from {shown} is larger than {} bytes, far more than a client configuration token (a few KB); check that the URL serves the .tok file",
                crate::model::token::MAX_TOKEN_BYTES
            )),
            Err(BodyError::Broken(e)) if e.is_timeout() => Attempt::Retry(too_slow(timeout)),
            Err(BodyError::Broken(e)) => {
                Attempt::Retry(format!("the download broke off: {}", chain(e)))
            }
        }
    };
    match tokio::time::timeout(timeout, whole).await {
        Ok(a) => a,
        Err(_) => Attempt::Retry(too_slow(timeout)),
    }
}

/// An answer that is not a success: worth another attempt (5xx, 408, 429) or not (the rest,
/// with the hint for its code).
fn refused_status(status: reqwest::StatusCode, shown: &str) -> Option<Attempt> {
    if status.is_success() {
        return None;
    }
    let code = status.as_u16();
    let last = format!("the server answered HTTP {status}");
    if status.is_server_error() || code == 408 || code == 429 {
        return Some(Attempt::Retry(last));
    }
    let hint = match code {
        401 | 403 => "check the credentials the URL needs",
        404 | 410 => "check the URL",
        _ => "check the URL and the server",
    };
    Some(Attempt::Fail(anyhow!(
        "cannot download the token from {shown}: {last}; {hint}"
    )))
}

/// The attempt's time limit ran out (the client's own limit and this one are the same).
fn too_slow(timeout: Duration) -> String {
    format!(
        "no whole answer within the time limit of {} s (--timeout)",
        timeout.as_secs()
    )
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
            crate::model::text::escape(&e.to_string())
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
            match attempt(&client, &url, &shown, timeout, ca_file).await {
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
