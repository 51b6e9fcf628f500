//! Credentials: extracting them from requests, the admin key, and the HMAC-derived gateway key and
//! per-session tokens of the session-gateway route mode (reference section 6.3, bit for bit).
//!
//! Every comparison of a presented secret is constant-time; keys are looked up by their SHA-256 digest.

#[cfg(test)]
mod tests;

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The reference's public default admin key; refused on non-loopback binds.
pub const DEFAULT_ADMIN_KEY: &str = "areal-admin-key";

const GATEWAY_KEY_MESSAGE: &[u8] = b"areal-session-gateway-key-v1";
const SESSION_TOKEN_PREFIX: &[u8] = b"areal-session-gateway-token-v1:";

/// The credentials a request presents: the bearer token of `Authorization` (scheme case-insensitive), then
/// `x-api-key`, without duplicates.
pub(crate) fn credentials(headers: &HeaderMap) -> Vec<SecretString> {
    let mut out: Vec<String> = Vec::with_capacity(2);
    if let Some(auth) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let auth = auth.trim();
        if let Some((scheme, token)) = auth.split_once(' ')
            && scheme.eq_ignore_ascii_case("bearer")
            && !token.trim().is_empty()
        {
            out.push(token.trim().to_string());
        }
    }
    if let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        let key = key.trim();
        if !key.is_empty() && !out.iter().any(|k| k == key) {
            out.push(key.to_string());
        }
    }
    out.into_iter().map(SecretString::from).collect()
}

/// The SHA-256 digest of a key, used as the key of lookup tables.
pub(crate) fn digest(key: &SecretString) -> [u8; 32] {
    Sha256::digest(key.expose_secret().as_bytes()).into()
}

/// Constant-time equality of two secrets (by digest, so lengths do not leak either).
pub fn secrets_equal(a: &SecretString, b: &SecretString) -> bool {
    digest(a).ct_eq(&digest(b)).into()
}

fn hmac_hex(key: &[u8], message: &[&[u8]]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC accepts keys of any length");
    for part in message {
        mac.update(part);
    }
    let bytes = mac.finalize().into_bytes();
    let mut out = String::with_capacity(64);
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The generation-only gateway key derived from the admin key:
/// `"areal-gateway-" + hex(HMAC-SHA256(admin key, "areal-session-gateway-key-v1"))`.
pub fn gateway_key(admin_key: &SecretString) -> SecretString {
    let hex = hmac_hex(admin_key.expose_secret().as_bytes(), &[GATEWAY_KEY_MESSAGE]);
    SecretString::from(format!("areal-gateway-{hex}"))
}

/// The token of `session_id` under `gateway_key`:
/// `"areal-session-" + hex(HMAC-SHA256(gateway key, "areal-session-gateway-token-v1:" + session id))`.
pub fn session_token(gateway_key: &SecretString, session_id: &str) -> SecretString {
    let hex = hmac_hex(
        gateway_key.expose_secret().as_bytes(),
        &[SESSION_TOKEN_PREFIX, session_id.as_bytes()],
    );
    SecretString::from(format!("areal-session-{hex}"))
}

/// A fresh random key: 32 random bytes, URL-safe base64 without padding (43 characters).
pub(crate) fn random_key() -> SecretString {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    SecretString::from(base64_url(&bytes))
}

/// `n` random bytes as lowercase hex.
pub fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rand::fill(bytes.as_mut_slice());
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}
