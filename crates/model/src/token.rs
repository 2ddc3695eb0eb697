//! The client configuration token: a JWS compact string whose payload names the DLS nodes.
//!
//! The token is opaque to its user and a secret to the logs: nothing here ever returns or
//! prints the signature, the key material or the raw token text. Decoding the payload for a
//! report is fine; there is nothing on the guest to verify the signature against.

use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use std::fmt;

/// A real token is a few KB; anything far larger is not one.
pub const MAX_TOKEN_BYTES: usize = 64 * 1024;

const B64URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// One DLS node of the token, with its ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlsNode {
    pub host: String,
    pub auth_port: u16,
    pub lease_port: u16,
}

/// What a token says (never the key or the signature).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Token {
    pub algorithm: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub token_id: Option<String>,
    pub issued_at: Option<DateTime<Utc>>,
    pub not_before: Option<DateTime<Utc>>,
    pub expires: Option<DateTime<Utc>>,
    pub instance_ref: Option<String>,
    pub scope_refs: Vec<String>,
    pub nodes: Vec<DlsNode>,
}

/// Why a token that decodes cannot be used at a given moment: the moment is outside its
/// time window. What each caller says of it (install refuses, status reports a failure,
/// `token inspect` exits 1) is built on this one judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untimely {
    Expired(DateTime<Utc>),
    NotYetValid(DateTime<Utc>),
}

impl Untimely {
    /// The name `token inspect --json` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Untimely::Expired(_) => "expired",
            Untimely::NotYetValid(_) => "not_yet_valid",
        }
    }
}

/// Why some bytes are not a usable client configuration token. `Display` is one line that
/// says what the input is not and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    Empty,
    TooLarge(usize),
    NotUtf8,
    LooksLikeGriddConf,
    LooksLikePem,
    NotJws(usize),
    BadEncoding(&'static str),
    BadJson(&'static str),
    Truncated(usize),
    NotClientToken(&'static str),
    NoDlsNode,
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const FIX: &str = "download the client configuration token again from the DLS (Service Instance > Generate client config token) and install the file unchanged";
        match self {
            TokenError::Empty => write!(f, "the token is empty; {FIX}"),
            TokenError::TooLarge(_) => write!(
                f,
                "larger than {} KiB, far more than a client configuration token (a few KB); give the .tok file downloaded from the DLS",
                MAX_TOKEN_BYTES >> 10
            ),
            TokenError::NotUtf8 => write!(
                f,
                "this is not a client configuration token: it is not text (invalid UTF-8), a token is a base64url JWS string; {FIX}"
            ),
            TokenError::LooksLikeGriddConf => write!(
                f,
                "this is a gridd.conf, not a client configuration token: gridd.conf belongs in /etc/nvidia/gridd.conf, the token is the .tok file from the DLS"
            ),
            TokenError::LooksLikePem => write!(
                f,
                "this is a PEM certificate or key, not a client configuration token; {FIX}"
            ),
            TokenError::NotJws(n) => write!(
                f,
                "this is not a client configuration token: expected three base64url parts separated by '.', found {n}; {FIX}"
            ),
            TokenError::BadEncoding(part) => write!(
                f,
                "the token's {part} is not valid base64url (altered by a copy-paste?); {FIX}"
            ),
            TokenError::BadJson(part) => write!(
                f,
                "the token's {part} does not decode to JSON (truncated or altered?); {FIX}"
            ),
            TokenError::Truncated(n) => write!(
                f,
                "the token's signature is {n} bytes, not an RSA signature (the token looks truncated); {FIX}"
            ),
            TokenError::NotClientToken(what) => write!(
                f,
                "this JWT is not a client configuration token ({what}); {FIX}"
            ),
            TokenError::NoDlsNode => write!(
                f,
                "the token names no DLS node (empty node_url_list); generate a new token on a DLS instance that has a node"
            ),
        }
    }
}

impl std::error::Error for TokenError {}

fn field_str(v: &Value, key: &str) -> Option<String> {
    match v.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn field_time(v: &Value, key: &str) -> Option<DateTime<Utc>> {
    let secs = v.get(key)?.as_f64()?;
    // Beyond i64 seconds (or not finite) a cast would clamp: not a time.
    if !secs.is_finite() || secs.abs() >= 9.2e18 {
        return None;
    }
    DateTime::from_timestamp(secs as i64, 0)
}

fn port_of(set: Option<&Value>, service: &str) -> u16 {
    set.and_then(|s| s.get("svc_port_map"))
        .and_then(Value::as_array)
        .and_then(|m| {
            m.iter()
                .find(|e| e.get("service").and_then(Value::as_str) == Some(service))
        })
        .and_then(|e| e.get("port"))
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .unwrap_or(443)
}

/// A token file's text, trimmed, once it is not too large, is text, and is not something
/// else a token is often confused with (a PEM file, a gridd.conf).
fn token_text(bytes: &[u8]) -> Result<&str, TokenError> {
    if bytes.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::TooLarge(bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| TokenError::NotUtf8)?;
    let text = text.trim();
    if text.is_empty() {
        return Err(TokenError::Empty);
    }
    if text.contains("-----BEGIN") {
        return Err(TokenError::LooksLikePem);
    }
    let looks_like_conf = text.lines().any(|l| {
        let l = l.trim_start();
        l.starts_with('#')
            || ["FeatureType", "ServerAddress", "ServerPort", "EnableUI"]
                .iter()
                .any(|k| l.starts_with(k))
    });
    if looks_like_conf {
        return Err(TokenError::LooksLikeGriddConf);
    }
    Ok(text)
}

/// The JWS's header and payload, as JSON, once its three parts decode and its signature is
/// an RSA signature's size.
fn jws_parts(text: &str) -> Result<(Value, Value), TokenError> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() != 3 || parts.iter().any(|p| p.is_empty()) {
        return Err(TokenError::NotJws(parts.len()));
    }
    let header = B64URL
        .decode(parts[0])
        .map_err(|_| TokenError::BadEncoding("header"))?;
    let payload = B64URL
        .decode(parts[1])
        .map_err(|_| TokenError::BadEncoding("payload"))?;
    let signature = B64URL
        .decode(parts[2])
        .map_err(|_| TokenError::BadEncoding("signature"))?;
    let header: Value =
        serde_json::from_slice(&header).map_err(|_| TokenError::BadJson("header"))?;
    let payload: Value =
        serde_json::from_slice(&payload).map_err(|_| TokenError::BadJson("payload"))?;
    if !payload.is_object() {
        return Err(TokenError::BadJson("payload"));
    }
    if !matches!(signature.len(), 128 | 256 | 384 | 512) {
        return Err(TokenError::Truncated(signature.len()));
    }
    Ok((header, payload))
}

/// The DLS nodes the service instance's configuration names, each with its ports.
fn dls_nodes(sic: &Value) -> Result<Vec<DlsNode>, TokenError> {
    let node_list = sic
        .get("node_url_list")
        .and_then(Value::as_array)
        .ok_or(TokenError::NotClientToken("no node_url_list"))?;
    let port_sets = sic.get("svc_port_set_list").and_then(Value::as_array);
    let mut nodes = Vec::new();
    for node in node_list {
        let Some(host) = node.get("url").and_then(Value::as_str) else {
            continue;
        };
        let host = host.trim();
        if host.is_empty() {
            continue;
        }
        let idx = node
            .get("svc_port_set_idx")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let set = port_sets.and_then(|sets| {
            sets.iter()
                .find(|s| s.get("idx").and_then(Value::as_u64) == Some(idx))
                .or_else(|| sets.get(idx as usize))
        });
        nodes.push(DlsNode {
            host: host.to_string(),
            auth_port: port_of(set, "auth"),
            lease_port: port_of(set, "lease"),
        });
    }
    if nodes.is_empty() {
        return Err(TokenError::NoDlsNode);
    }
    Ok(nodes)
}

/// A time that is there but cannot be a time (not a number, out of range) makes the token
/// unusable: an `exp` read as absent would mean "never expires".
fn check_times(payload: &Value) -> Result<(), TokenError> {
    for key in ["iat", "nbf", "exp"] {
        if payload.get(key).is_some_and(|v| !v.is_null()) && field_time(payload, key).is_none() {
            return Err(TokenError::BadJson("payload's times"));
        }
    }
    Ok(())
}

/// A token that expires sooner than this is a warning everywhere: `install`, the service's
/// adoption, `status` and the report, `diagnose`, and the fleet's alert.
pub const EXPIRY_WARNING_DAYS: i64 = 14;

impl Token {
    /// Its expiry, when that is within [`EXPIRY_WARNING_DAYS`] of `now` (and not past).
    pub fn expires_soon(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.expires
            .filter(|e| *e > now && *e - now < chrono::Duration::days(EXPIRY_WARNING_DAYS))
    }

    /// Decodes a token file's bytes. Surrounding whitespace is tolerated.
    pub fn decode(bytes: &[u8]) -> Result<Token, TokenError> {
        let text = token_text(bytes)?;
        let (header, payload) = jws_parts(text)?;
        let sic =
            payload
                .get("service_instance_configuration")
                .ok_or(TokenError::NotClientToken(
                    "no service_instance_configuration",
                ))?;
        let nodes = dls_nodes(sic)?;
        let scope_refs = payload
            .get("scope_ref_list")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        check_times(&payload)?;
        Ok(Token {
            algorithm: field_str(&header, "alg"),
            issuer: field_str(&payload, "iss"),
            audience: field_str(&payload, "aud"),
            token_id: field_str(&payload, "jti"),
            issued_at: field_time(&payload, "iat"),
            not_before: field_time(&payload, "nbf"),
            expires: field_time(&payload, "exp"),
            instance_ref: field_str(sic, "nls_service_instance_ref"),
            scope_refs,
            nodes,
        })
    }

    /// Whether the token is valid at `now`; an expiry wins over a start still ahead.
    pub fn validity(&self, now: DateTime<Utc>) -> Result<(), Untimely> {
        match (self.not_before, self.expires) {
            (_, Some(exp)) if exp <= now => Err(Untimely::Expired(exp)),
            (Some(nbf), _) if nbf > now => Err(Untimely::NotYetValid(nbf)),
            _ => Ok(()),
        }
    }
}

/// How long a file of the token directory may stay open for writing before the agent names
/// it: a copy takes seconds; an editor or a stuck copy holds it for minutes.
pub const HELD_BOUND: std::time::Duration = std::time::Duration::from_secs(120);

/// Tokens for tests, of this crate and of the agent's (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use base64::Engine as _;
    use serde_json::Value;

    /// Builds a token with the structure of a real one (see the sample payload), signed with
    /// 256 bytes of filler.
    pub fn make_token(payload: &Value) -> String {
        let e = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.{}",
            e.encode(br#"{"alg":"RS256","typ":"JWT"}"#),
            e.encode(payload.to_string()),
            e.encode([7u8; 256])
        )
    }

    /// A token of one DLS (`dls-a.example`, ports 443), valid from `nbf` to `exp`; `jti` to
    /// make tokens differ.
    pub fn token_with(jti: &str, nbf: i64, exp: i64) -> String {
        make_token(&serde_json::json!({
            "iss": "NLS Service Instance", "aud": "NLS Licensed Client",
            "iat": nbf, "nbf": nbf, "exp": exp, "jti": jti,
            "scope_ref_list": ["20000000-0000-0000-0000-000000000001"],
            "service_instance_configuration": {
                "nls_service_instance_ref": "10000000-0000-0000-0000-000000000001",
                "svc_port_set_list": [{"idx": 0, "d_name": "DLS", "svc_port_map": [
                    {"service": "auth", "port": 443}, {"service": "lease", "port": 443}]}],
                "node_url_list": [{"idx": 0, "url": "dls-a.example", "svc_port_set_idx": 0}]
            },
            "service_instance_public_key_configuration": {
                "service_instance_public_key_pem": "-----KEY MATERIAL-----"
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::testing::make_token;
    use super::*;

    fn payload() -> Value {
        serde_json::json!({
            "iss": "NLS Service Instance", "aud": "NLS Licensed Client",
            "iat": 1700000000, "nbf": 1700000000, "exp": 2078691200, "jti": "j-1",
            "scope_ref_list": ["20000000-0000-0000-0000-000000000001"],
            "service_instance_configuration": {
                "nls_service_instance_ref": "10000000-0000-0000-0000-000000000001",
                "svc_port_set_list": [
                    {"idx": 0, "d_name": "DLS", "svc_port_map": [
                        {"service": "auth", "port": 443}, {"service": "lease", "port": 443}]},
                    {"idx": 1, "d_name": "DLS", "svc_port_map": [
                        {"service": "auth", "port": 8081}, {"service": "lease", "port": 8082}]}
                ],
                "node_url_list": [
                    {"idx": 0, "url": "dls-a.example", "svc_port_set_idx": 0},
                    {"idx": 1, "url": "10.0.0.6", "svc_port_set_idx": 1}
                ]
            },
            "service_instance_public_key_configuration": {"service_instance_public_key_pem": "KEY"}
        })
    }

    #[test]
    fn decodes_nodes_ports_and_times() {
        let t = Token::decode(make_token(&payload()).as_bytes()).unwrap();
        assert_eq!(t.nodes.len(), 2);
        assert_eq!(t.nodes[0].host, "dls-a.example");
        assert_eq!((t.nodes[1].auth_port, t.nodes[1].lease_port), (8081, 8082));
        assert_eq!(
            t.issued_at.unwrap().to_rfc3339(),
            "2023-11-14T22:13:20+00:00"
        );
        assert_eq!(
            t.instance_ref.as_deref(),
            Some("10000000-0000-0000-0000-000000000001")
        );
        let now = DateTime::from_timestamp(1800000000, 0).unwrap();
        assert_eq!(t.validity(now), Ok(()));
        let later = DateTime::from_timestamp(2078691200, 0).unwrap();
        assert!(matches!(t.validity(later), Err(Untimely::Expired(_))));
        let earlier = DateTime::from_timestamp(1600000000, 0).unwrap();
        assert!(matches!(t.validity(earlier), Err(Untimely::NotYetValid(_))));
    }

    #[test]
    fn an_expiry_that_cannot_be_a_time_is_invalid_not_never() {
        for exp in [
            serde_json::json!(1e300),
            serde_json::json!(-1e300),
            serde_json::json!(99999999999999999u64),
            serde_json::json!("soon"),
        ] {
            let mut p = payload();
            p["exp"] = exp.clone();
            let e = Token::decode(make_token(&p).as_bytes()).unwrap_err();
            assert_eq!(e, TokenError::BadJson("payload's times"), "{exp}");
        }
        let mut p = payload();
        p.as_object_mut().unwrap().remove("exp");
        assert!(
            Token::decode(make_token(&p).as_bytes())
                .unwrap()
                .expires
                .is_none()
        );
    }

    #[test]
    fn rejects_what_is_not_a_token_with_a_reason() {
        let tok = make_token(&payload());
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"".to_vec(), "empty"),
            (b"  \n".to_vec(), "empty"),
            (vec![0xff, 0xfe, 0x00], "invalid UTF-8"),
            (b"# gridd\nFeatureType=1\n".to_vec(), "gridd.conf"),
            (b"garbage".to_vec(), "three base64url parts"),
            (tok.as_bytes()[..tok.len() - 40].to_vec(), "truncated"),
            (tok.as_bytes()[..tok.len() / 2].to_vec(), "token"),
            (vec![b'a'; 10 << 20], "far more"),
        ];
        for (input, want) in cases {
            let e = Token::decode(&input).unwrap_err().to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
            assert!(!e.contains('\n'));
        }
        let mut p = payload();
        p["service_instance_configuration"]["node_url_list"] = serde_json::json!([]);
        assert_eq!(
            Token::decode(make_token(&p).as_bytes()),
            Err(TokenError::NoDlsNode)
        );
        let auth_code = make_token(&serde_json::json!({"iat": 1, "exp": 2, "challenge": "x"}));
        assert!(matches!(
            Token::decode(auth_code.as_bytes()),
            Err(TokenError::NotClientToken(_))
        ));
    }
}
