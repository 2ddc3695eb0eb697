//! The client configuration token as the simulator makes and judges it, written from the
//! token format (domain.md; `tests/fixtures/samples/token-payload-1.json`), not from the
//! agent's `src/token.rs`, so that the agent and the simulated gridd cannot share a mistake:
//!
//! - a JWS compact string `base64url(header).base64url(payload).base64url(signature)`,
//!   header `{"alg":"RS256","typ":"JWT"}`;
//! - the payload's DLS nodes: `service_instance_configuration.node_url_list[i].url`, their
//!   ports from `svc_port_set_list[node.svc_port_set_idx].svc_port_map[]` (`auth`, `lease`;
//!   443 when absent).
//!
//! The simulated DLS signs with the TEST KEY in `tests/fixtures/sim/` (RSA PKCS#1 v1.5,
//! SHA-256); the simulated gridd verifies with the public half only, as the real gridd rejects
//! a token whose signature does not verify (an edited payload) while the agent, which has
//! nothing to verify against, cannot tell.

#![allow(dead_code)]

use base64::Engine;
use ring::signature::{self, KeyPair, RsaKeyPair, UnparsedPublicKey};
use serde_json::Value;

/// A TEST KEY (see `tests/fixtures/sim/README.md`): signs the simulator's tokens only.
const SIGNING_KEY_PEM: &str = include_str!("../fixtures/sim/token-signing-key.pk8.pem");
/// Its public half: all the simulated gridd knows.
pub const PUBLIC_KEY_PEM: &str = include_str!("../fixtures/sim/token-signing-key.pub.pem");

const B64URL: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The DER inside a PEM block.
pub fn pem_der(pem: &str) -> Vec<u8> {
    let body: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::trim)
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("a PEM body")
}

/// One DER element at the start of `der`: (tag, contents, rest).
fn der_element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, b| a << 8 | *b as usize);
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The PKCS#1 `RSAPublicKey` inside an X.509 `SubjectPublicKeyInfo` (a `PUBLIC KEY` PEM):
/// SEQUENCE { SEQUENCE { algorithm }, BIT STRING { 0 unused bits, RSAPublicKey } }.
pub fn spki_rsa_public_key(spki: &[u8]) -> Option<Vec<u8>> {
    let (0x30, body, _) = der_element(spki)? else {
        return None;
    };
    let (0x30, _algorithm, rest) = der_element(body)? else {
        return None;
    };
    let (0x03, bits, _) = der_element(rest)? else {
        return None;
    };
    let (&0, key) = bits.split_first()? else {
        return None;
    };
    Some(key.to_vec())
}

fn signing_key() -> RsaKeyPair {
    RsaKeyPair::from_pkcs8(&pem_der(SIGNING_KEY_PEM)).expect("the test key is PKCS#8 RSA")
}

/// The PKCS#1 public key derived from the signing key (the self-check compares it with
/// [`PUBLIC_KEY_PEM`]).
pub fn signing_key_public() -> Vec<u8> {
    signing_key().public_key().as_ref().to_vec()
}

/// Signs `payload` as the DLS does: a JWS compact token, RS256.
pub fn sign(payload: &Value) -> Vec<u8> {
    let signing_input = format!(
        "{}.{}",
        B64URL.encode(br#"{"alg":"RS256","typ":"JWT"}"#),
        B64URL.encode(payload.to_string())
    );
    let key = signing_key();
    let mut sig = vec![0u8; key.public().modulus_len()];
    key.sign(
        &signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signing_input.as_bytes(),
        &mut sig,
    )
    .expect("RSA signing");
    format!("{signing_input}.{}", B64URL.encode(sig)).into_bytes()
}

/// A DLS node of a token, as the simulated gridd uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub host: String,
    pub auth_port: u16,
    pub lease_port: u16,
}

/// Why the simulated gridd rejects a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// Not three base64url parts of JSON, or not RS256.
    Malformed(&'static str),
    /// The signature does not verify with the DLS's public key.
    Signature,
    /// No DLS node in the payload.
    NoNodes,
}

/// A token gridd accepts: signed by the (simulated) DLS, naming at least one node.
#[derive(Debug, Clone)]
pub struct Verified {
    pub nodes: Vec<Node>,
    pub payload: Value,
}

/// Judges a token file's bytes as the simulated gridd does.
pub fn verify(bytes: &[u8]) -> Result<Verified, Rejected> {
    let text = std::str::from_utf8(bytes).map_err(|_| Rejected::Malformed("not text"))?;
    let text = text.trim();
    let parts: Vec<&str> = text.split('.').collect();
    let [header, payload, sig] = parts[..] else {
        return Err(Rejected::Malformed("not three parts"));
    };
    let json = |p: &str| -> Result<Value, Rejected> {
        let raw = B64URL
            .decode(p)
            .map_err(|_| Rejected::Malformed("not base64url"))?;
        serde_json::from_slice(&raw).map_err(|_| Rejected::Malformed("not JSON"))
    };
    let head = json(header)?;
    if head["alg"] != "RS256" {
        return Err(Rejected::Malformed("not RS256"));
    }
    let body = json(payload)?;
    let sig = B64URL
        .decode(sig)
        .map_err(|_| Rejected::Malformed("signature not base64url"))?;
    let public = spki_rsa_public_key(&pem_der(PUBLIC_KEY_PEM)).expect("the DLS's public key");
    UnparsedPublicKey::new(&signature::RSA_PKCS1_2048_8192_SHA256, public)
        .verify(format!("{header}.{payload}").as_bytes(), &sig)
        .map_err(|_| Rejected::Signature)?;
    let nodes = nodes(&body);
    if nodes.is_empty() {
        return Err(Rejected::NoNodes);
    }
    Ok(Verified {
        nodes,
        payload: body,
    })
}

/// The payload's DLS nodes with their auth and lease ports.
fn nodes(payload: &Value) -> Vec<Node> {
    let cfg = &payload["service_instance_configuration"];
    let sets = cfg["svc_port_set_list"].as_array();
    let port = |set_idx: u64, service: &str| -> u16 {
        sets.and_then(|sets| {
            sets.iter()
                .find(|s| s["idx"].as_u64() == Some(set_idx))
                .or_else(|| sets.get(set_idx as usize))
        })
        .and_then(|s| s["svc_port_map"].as_array())
        .and_then(|m| m.iter().find(|e| e["service"] == service))
        .and_then(|e| e["port"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(443)
    };
    cfg["node_url_list"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|n| {
                    let host = n["url"].as_str()?.trim().to_string();
                    let set = n["svc_port_set_idx"].as_u64().unwrap_or(0);
                    (!host.is_empty()).then(|| Node {
                        host,
                        auth_port: port(set, "auth"),
                        lease_port: port(set, "lease"),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}
