//! What is asked of an install or an adoption, judged before anything is read: the token
//! (does it decode, is it valid now, does `--force` pass it), the words it is installed with
//! (its summary, its warnings) and the FeatureType asked for.

use chrono::{DateTime, Utc};

use super::TokenRejected;
use crate::time::rfc3339;
use crate::token::Token;

/// The end of every refusal: an install refused changes nothing.
pub fn nothing_changed() -> &'static str {
    "nothing was changed"
}

/// Decodes and checks a token; with `force`, an expired or not-yet-valid token passes with a
/// warning.
pub fn validate(
    bytes: &[u8],
    now: DateTime<Utc>,
    force: bool,
) -> Result<(Token, Option<String>), TokenRejected> {
    let token = Token::decode(bytes).map_err(TokenRejected::Invalid)?;
    let rejected = match token.validity(now) {
        Ok(()) => return Ok((token, None)),
        Err(why) => TokenRejected::Untimely { why, now },
    };
    if force {
        Ok((token, Some(format!("--force: {rejected}"))))
    } else {
        Err(rejected)
    }
}

/// The warnings a token is installed with, in order: `forced` (what `--force` let pass), a
/// CR line end, an expiry soon.
pub fn warnings(
    bytes: &[u8],
    token: &Token,
    now: DateTime<Utc>,
    forced: Option<String>,
) -> Vec<String> {
    forced
        .into_iter()
        .chain(crlf_warning(bytes))
        .chain(expiry_warning(token, now))
        .collect()
}

/// A token that expires soon is installed, with a word: the next acquisition after its expiry
/// fails.
fn expiry_warning(token: &Token, now: DateTime<Utc>) -> Option<String> {
    let exp = token.expires_soon(now)?;
    let left = exp - now;
    let shown = if left.num_hours() >= 48 {
        format!("{} days", left.num_days())
    } else if left.num_minutes() >= 120 {
        format!("{} hours", left.num_hours())
    } else {
        format!("{} minutes", left.num_minutes().max(1))
    };
    Some(format!(
        "the token expires at {} (in {shown}): generate a new one on the DLS and install it before then",
        rfc3339(exp)
    ))
}

/// A token with a CR line end (saved on Windows, pasted through a Windows editor) is
/// installed byte for byte, as every token is; whether gridd reads it so is not known.
fn crlf_warning(bytes: &[u8]) -> Option<String> {
    bytes.contains(&b'\r').then(|| {
        "the token has a CR (Windows) line end; it is installed byte for byte, but if nvidia-gridd fails to decode it, save it with a Unix line end (`dos2unix FILE`) and install it again".to_string()
    })
}

/// One line about the token: its size, its DLS nodes, its validity. Never its content.
pub fn summary(bytes: &[u8], token: &Token) -> String {
    let nodes: Vec<String> = token
        .nodes
        .iter()
        .map(|n| format!("{}:{}", crate::text::escape(&n.host), n.lease_port))
        .collect();
    let until = token
        .expires
        .map(|e| format!(", valid until {}", rfc3339(e)))
        .unwrap_or_default();
    format!(
        "token: {} bytes, DLS {}{until}",
        bytes.len(),
        nodes.join(", ")
    )
}

/// The FeatureType asked for, refused (with nothing changed) where gridd knows no such value.
pub fn check_feature_type(ft: u8) -> anyhow::Result<()> {
    if matches!(ft, 0 | 1 | 2 | 4) {
        Ok(())
    } else {
        Err(anyhow::anyhow!(
            "--feature-type {ft}: expected 1 (NVIDIA vGPU, right for every vGPU guest), 0 (unlicensed), 2 (RTX Virtual Workstation, passthrough) or 4 (Virtual Compute Server, passthrough); {}",
            nothing_changed()
        ))
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::token::testing::make_token;

    /// A token valid from `nbf` to `exp` (Unix seconds), its bytes with `end` after them.
    fn token(nbf: i64, exp: i64, end: &str) -> Vec<u8> {
        let payload = serde_json::json!({
            "iss": "NLS Service Instance", "iat": nbf, "nbf": nbf, "exp": exp, "jti": "j",
            "service_instance_configuration": {
                "svc_port_set_list": [{"idx": 0, "svc_port_map": [
                    {"service": "auth", "port": 443}, {"service": "lease", "port": 443}]}],
                "node_url_list": [{"idx": 0, "url": "dls.example", "svc_port_set_idx": 0}]
            }
        });
        format!("{}{end}", make_token(&payload)).into_bytes()
    }

    #[test]
    fn a_token_passes_when_valid_now_or_forced() {
        let now = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
        let valid = token(1_700_000_000, 2_000_000_000, "");
        let expired = token(1_700_000_000, 1_750_000_000, "");
        let early = token(1_900_000_000, 2_000_000_000, "");
        assert!(matches!(validate(&valid, now, false), Ok((_, None))));
        for t in [&expired, &early] {
            assert!(matches!(
                validate(t, now, false),
                Err(TokenRejected::Untimely { .. })
            ));
            let (_, forced) = validate(t, now, true).unwrap();
            assert!(forced.unwrap().starts_with("--force: the token "));
        }
        assert!(matches!(
            validate(b"not a token", now, true),
            Err(TokenRejected::Invalid(_))
        ));
    }

    #[test]
    fn warnings_come_in_order_and_only_where_due() {
        let now = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
        let far = 2_000_000_000;
        let t = |bytes: &[u8]| Token::decode(bytes).unwrap();
        let plain = token(1_700_000_000, far, "");
        assert!(warnings(&plain, &t(&plain), now, None).is_empty());
        let crlf = token(1_700_000_000, far, "\r\n");
        let soon = token(1_700_000_000, 1_800_000_000 + 3 * 3600, "\r\n");
        let w = warnings(&soon, &t(&crlf), now, Some("--force: x".into()));
        assert_eq!(w.len(), 2, "{w:?}");
        assert_eq!(w[0], "--force: x");
        assert!(w[1].contains("CR (Windows) line end"), "{w:?}");
        let w = warnings(&soon, &t(&soon), now, None);
        assert!(w[1].contains("(in 3 hours)"), "{w:?}");
        assert!(summary(&plain, &t(&plain)).starts_with(&format!(
            "token: {} bytes, DLS dls.example:443, valid until",
            plain.len()
        )));
    }

    #[test]
    fn only_the_feature_types_gridd_knows_pass() {
        for ft in 0..=255u8 {
            assert_eq!(
                check_feature_type(ft).is_ok(),
                [0, 1, 2, 4].contains(&ft),
                "{ft}"
            );
        }
        let e = check_feature_type(3).unwrap_err().to_string();
        assert!(e.ends_with("; nothing was changed"), "{e}");
    }
}
