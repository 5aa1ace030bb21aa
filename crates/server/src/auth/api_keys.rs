//! API keys: each configured key names a user. Keys are kept as their SHA-256 digests only, so
//! neither the config file nor the process's memory holds a key a reader could reuse.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use super::AuthUser;

#[derive(Default)]
pub struct ApiKeys {
    by_digest: HashMap<[u8; 32], AuthUser>,
}

impl ApiKeys {
    /// Adds a key by its digest; `false` when another key has that digest already.
    pub fn insert(&mut self, digest: [u8; 32], user: AuthUser) -> bool {
        self.by_digest.insert(digest, user).is_none()
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// The user of `key`. Looked up by the key's digest, so the time it takes says nothing of
    /// how much of a stored key a guess shares.
    pub fn find(&self, key: &str) -> Option<&AuthUser> {
        if self.by_digest.is_empty() {
            return None;
        }
        self.by_digest.get(&digest(key))
    }
}

pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A digest as the config writes it: 64 hexadecimal digits (`sha256sum`'s output).
pub fn parse_digest(hex_digest: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_digest.trim(), &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_by_its_digest_and_only_by_it() {
        let mut keys = ApiKeys::default();
        let user = AuthUser::authenticated("alice".into(), None, vec![]);
        assert!(keys.insert(digest("secret-1"), user.clone()));
        assert_eq!(keys.find("secret-1"), Some(&user));
        assert_eq!(keys.find("secret-2"), None);
        assert_eq!(keys.find(""), None);
        assert!(!keys.insert(digest("secret-1"), user));
    }

    #[test]
    fn digests_are_sha256sums_output() {
        let expected =
            parse_digest("2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b")
                .unwrap();
        assert_eq!(digest("secret"), expected);
        assert_eq!(parse_digest("not hex"), None);
        assert_eq!(parse_digest("abcd"), None);
    }
}
