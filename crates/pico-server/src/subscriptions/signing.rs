//! The server's webhook signing key (Ed25519), its JWKS, the `Webhook-Signature` header, and the
//! HMAC callback/claim tokens. One 32-byte seed, kept in the metadata KV, yields both the signing
//! key and the token key, so signatures and outstanding tokens survive restarts.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ed25519_dalek::{Signer, SigningKey};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Signing material derived from one seed.
pub struct Keys {
    signing: SigningKey,
    kid: String,
    x: String,
    token_key: [u8; 32],
}

impl Keys {
    pub fn from_seed(seed: [u8; 32]) -> Keys {
        let signing = SigningKey::from_bytes(&seed);
        let x = B64.encode(signing.verifying_key().as_bytes());
        // RFC 7638 thumbprint: members in lexicographic order, no whitespace.
        let thumbprint_input = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
        let kid = format!("ds_{}", B64.encode(Sha256::digest(thumbprint_input)));
        let mut h = Sha256::new();
        h.update(b"picomq ds callback token v1\0");
        h.update(seed);
        Keys {
            signing,
            kid,
            x,
            token_key: h.finalize().into(),
        }
    }

    pub fn generate() -> (Keys, [u8; 32]) {
        let seed: [u8; 32] = rand::random();
        (Keys::from_seed(seed), seed)
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public JWK Set served at `__ds/jwks.json`.
    pub fn jwks(&self) -> Value {
        json!({
            "keys": [{
                "kty": "OKP",
                "crv": "Ed25519",
                "kid": self.kid,
                "use": "sig",
                "alg": "EdDSA",
                "x": self.x,
            }]
        })
    }

    /// `t=<unix>,kid=<kid>,ed25519=<base64url signature of "<t>.<body>">`.
    pub fn signature_header(&self, unix_secs: i64, body: &[u8]) -> String {
        let mut msg = Vec::with_capacity(body.len() + 21);
        msg.extend_from_slice(unix_secs.to_string().as_bytes());
        msg.push(b'.');
        msg.extend_from_slice(body);
        let sig = self.signing.sign(&msg);
        format!(
            "t={unix_secs},kid={},ed25519={}",
            self.kid,
            B64.encode(sig.to_bytes())
        )
    }

    /// A bearer token bound to one subscription, generation and wake. Validity beyond the MAC is
    /// decided by the caller against the live state (generation fencing), so tokens carry no
    /// expiry: a lease expiry or a finished wake makes them stale.
    pub fn token(&self, claims: &TokenClaims) -> String {
        let payload = B64.encode(serde_json::to_vec(claims).unwrap_or_default());
        let mac = self.mac(payload.as_bytes());
        format!("{payload}.{}", B64.encode(mac))
    }

    /// The claims of a token this server issued, or `None` for a forged or malformed one.
    pub fn verify_token(&self, token: &str) -> Option<TokenClaims> {
        let (payload, mac) = token.split_once('.')?;
        let mac = B64.decode(mac).ok()?;
        let mut m = HmacSha256::new_from_slice(&self.token_key).ok()?;
        m.update(payload.as_bytes());
        m.verify_slice(&mac).ok()?;
        serde_json::from_slice(&B64.decode(payload).ok()?).ok()
    }

    fn mac(&self, data: &[u8]) -> Vec<u8> {
        match HmacSha256::new_from_slice(&self.token_key) {
            Ok(mut m) => {
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            // HMAC accepts keys of any length; unreachable in practice.
            Err(_) => Vec::new(),
        }
    }
}

/// What a callback or claim token is scoped to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClaims {
    pub sub: String,
    pub generation: u64,
    pub wake_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signature, Verifier, VerifyingKey};

    fn keys() -> Keys {
        Keys::from_seed([7u8; 32])
    }

    #[test]
    fn kid_is_stable_and_derived_from_the_key() {
        let a = keys();
        let b = keys();
        assert_eq!(a.kid(), b.kid());
        assert!(a.kid().starts_with("ds_"));
        assert_ne!(a.kid(), Keys::from_seed([8u8; 32]).kid());
    }

    #[test]
    fn jwks_describes_an_ed25519_key() {
        let k = keys();
        let jwks = k.jwks();
        let key = &jwks["keys"][0];
        assert_eq!(key["kty"], "OKP");
        assert_eq!(key["crv"], "Ed25519");
        assert_eq!(key["alg"], "EdDSA");
        assert_eq!(key["use"], "sig");
        assert_eq!(key["kid"], k.kid());
        assert_eq!(B64.decode(key["x"].as_str().unwrap()).unwrap().len(), 32);
    }

    #[test]
    fn signature_header_verifies_with_the_published_key() {
        let k = keys();
        let body = br#"{"subscription_id":"s"}"#;
        let header = k.signature_header(1_700_000_000, body);
        let parts: Vec<&str> = header.split(',').collect();
        assert_eq!(parts[0], "t=1700000000");
        assert_eq!(parts[1], format!("kid={}", k.kid()));
        let sig_b64 = parts[2].strip_prefix("ed25519=").unwrap();
        assert!(
            sig_b64
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        let x = B64
            .decode(k.jwks()["keys"][0]["x"].as_str().unwrap())
            .unwrap();
        let vk = VerifyingKey::from_bytes(&x.try_into().unwrap()).unwrap();
        let sig = Signature::from_slice(&B64.decode(sig_b64).unwrap()).unwrap();
        let mut msg = b"1700000000.".to_vec();
        msg.extend_from_slice(body);
        assert!(vk.verify(&msg, &sig).is_ok());
        // A different body or timestamp does not verify.
        assert!(vk.verify(b"1700000001.{}", &sig).is_err());
    }

    #[test]
    fn tokens_round_trip_and_reject_tampering() {
        let k = keys();
        let claims = TokenClaims {
            sub: "s1".into(),
            generation: 3,
            wake_id: "w_1".into(),
        };
        let t = k.token(&claims);
        assert_eq!(k.verify_token(&t), Some(claims.clone()));
        // Another server's key does not accept it.
        assert_eq!(Keys::from_seed([9u8; 32]).verify_token(&t), None);
        // Changing the payload breaks the MAC.
        let forged = TokenClaims {
            generation: 4,
            ..claims
        };
        let forged_payload = B64.encode(serde_json::to_vec(&forged).unwrap());
        let mac = t.split_once('.').unwrap().1;
        assert_eq!(k.verify_token(&format!("{forged_payload}.{mac}")), None);
        assert_eq!(k.verify_token("garbage"), None);
    }
}
