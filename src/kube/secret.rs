//! The GPU Operator's licensing Secret, where the config names it
//! (`kubernetes.licensing_secret`): that one Secret, fetched by its name (a Role limited by
//! `resourceNames` allows exactly this), at the start and at each heartbeat. Its token is
//! told to the service, which compares it with the one gridd runs with; nothing of it is
//! kept or shown but its dates.

use std::time::Duration;

use anyhow::anyhow;
use base64::Engine;
use reqwest::Url;
use serde_json::Value;
use tokio::sync::watch;

use super::{Api, MAX_ANSWER, Session};
use crate::model::config::SecretRef;
use crate::model::node::{SECRET_TOKEN_KEY, SecretToken};

/// Reads the Secret `name` now and then every `every`, and at once when `bell` rings (the
/// token gridd runs with changed), until `stop`; each read is told to `tell`.
pub async fn follow(
    api: Api,
    name: SecretRef,
    every: Duration,
    bell: std::sync::Arc<tokio::sync::Notify>,
    tell: impl Fn(Result<SecretToken, String>),
    mut stop: watch::Receiver<bool>,
) {
    let mut session = Session::default();
    loop {
        tell(read(&api, &mut session, &name).await);
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = bell.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// The Secret's token, or why it could not be read.
async fn read(api: &Api, session: &mut Session, name: &SecretRef) -> Result<SecretToken, String> {
    let what = format!("GET secret {name}");
    let fail = |e: String| format!("{what}: {e}");
    let client = session.client(api).map_err(|e| fail(format!("{e:#}")))?;
    let request = url(api, name)
        .and_then(|u| api.authed(client.get(u)))
        .map_err(|e| fail(format!("{e:#}")))?;
    let mut resp = request
        .send()
        .await
        .map_err(|e| fail(crate::http::chain(e)))?;
    let code = resp.status();
    if !code.is_success() {
        return Err(fail(format!("HTTP {code}{}", refused(code, name))));
    }
    let body = crate::http::body_capped(&mut resp, MAX_ANSWER)
        .await
        .map_err(|e| fail(super::answer_error(e, "a Secret")))?;
    let secret: Value =
        serde_json::from_slice(&body).map_err(|e| fail(format!("not a Secret: {e}")))?;
    token_of(&secret).map_err(|e| format!("secret {name}: {e}"))
}

/// `/api/v1/namespaces/{namespace}/secrets/{name}`.
fn url(api: &Api, name: &SecretRef) -> anyhow::Result<Url> {
    let mut url = api.base.clone();
    url.path_segments_mut()
        .map_err(|_| anyhow!("the API's URL cannot take a path"))?
        .pop_if_empty()
        .extend([
            "api",
            "v1",
            "namespaces",
            &name.namespace,
            "secrets",
            &name.name,
        ]);
    Ok(url)
}

/// What a refusal means, and its fix.
fn refused(code: reqwest::StatusCode, name: &SecretRef) -> String {
    match code.as_u16() {
        403 => format!(
            " (the agent may not read it: grant get on this one Secret with the Role of deploy/kubernetes/licensing-secret/, resourceNames [{}] in namespace {})",
            name.name, name.namespace
        ),
        404 => format!(
            " (no such Secret: kubernetes.licensing_secret names the operator's driver.licensingConfig.secretName in its namespace; `kubectl -n {} get secrets` lists them)",
            name.namespace
        ),
        _ => super::not_followed(code).to_string(),
    }
}

/// The token a Secret's `data` holds under the operator's key.
fn token_of(secret: &Value) -> Result<SecretToken, String> {
    let Some(data) = secret["data"][SECRET_TOKEN_KEY].as_str() else {
        return Ok(SecretToken::NoToken);
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|_| format!("its {SECRET_TOKEN_KEY} is not base64 data"))?;
    Ok(SecretToken::Token(Box::new(
        crate::model::token::Token::decode(&bytes),
    )))
}
