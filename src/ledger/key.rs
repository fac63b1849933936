//! The ledger's keyed hash of user ids: HMAC-SHA256 (RFC 2104) under a 32-byte secret, so that
//! neither the ledger file nor the key-value bucket holds a user id in clear, and nobody without the
//! secret can test a guessed user id against them.
//!
//! The secret is made once from the operating system's generator and kept beside the entries: in
//! the data directory ([`KeyedHash::load_or_create`]: `budget/hash.key`, read back on every start)
//! or, between replicas, as one key of the bucket created by whichever replica comes first
//! ([`super::kv`]), so every replica hashes a user id alike. Invariant: the secret never changes
//! once written (a changed secret would give every user a fresh budget); a secret file of the wrong
//! length is damage and refused.
//!
//! The file is created atomically and never over an existing one ([`crate::atomic_file`]'s
//! `create_with_bytes`), so the invariant holds by itself, not only under the ledger's lock. Its
//! temporary file has `tempfile`'s own name (`.hash.key.XXXXXX.partial`), not a fixed one: two
//! processes creating the secret at once then never share a temporary file, the first rename wins
//! and the other reads the winner's secret. A crash while the file is created can leave such a
//! temporary file, holding a secret never used; nothing reads it.
use std::io::ErrorKind;
use std::path::Path;

use rand::TryRngCore;
use sha2::{Digest, Sha256};

use super::LedgerError;
use crate::atomic_file::Step;

/// Length of the secret (bytes).
pub const SECRET_BYTES: usize = 32;
/// File name of the secret inside the ledger's directory.
pub const KEY_FILE: &str = "hash.key";

/// A user as the ledger knows them: HMAC-SHA256 of the user id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserHash(pub [u8; 32]);

impl std::fmt::Debug for UserHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserHash({}..)", hex::encode(&self.0[..4]))
    }
}

impl UserHash {
    /// Lower-case hex: the user's key in the bucket.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// HMAC-SHA256 under one secret.
#[derive(Clone)]
pub struct KeyedHash {
    secret: [u8; SECRET_BYTES],
}

impl std::fmt::Debug for KeyedHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyedHash(..)")
    }
}

impl KeyedHash {
    pub fn new(secret: [u8; SECRET_BYTES]) -> KeyedHash {
        KeyedHash { secret }
    }

    /// A fresh secret from the operating system's generator.
    pub fn random_secret() -> Result<[u8; SECRET_BYTES], LedgerError> {
        let mut secret = [0u8; SECRET_BYTES];
        rand::rngs::OsRng
            .try_fill_bytes(&mut secret)
            .map_err(|e| LedgerError::Unavailable {
                action: "drawing the ledger's hash secret",
                detail: e.to_string().into(),
            })?;
        Ok(secret)
    }

    /// The secret as stored.
    pub fn secret(&self) -> &[u8; SECRET_BYTES] {
        &self.secret
    }

    /// HMAC-SHA256(secret, message).
    pub fn mac(&self, message: &[u8]) -> [u8; 32] {
        // The secret is 32 bytes, within SHA-256's 64-byte block: it is padded, never hashed first.
        let mut ipad = [0x36u8; 64];
        let mut opad = [0x5cu8; 64];
        for (i, b) in self.secret.iter().enumerate() {
            ipad[i] ^= b;
            opad[i] ^= b;
        }
        let inner = Sha256::new()
            .chain_update(ipad)
            .chain_update(message)
            .finalize();
        Sha256::new()
            .chain_update(opad)
            .chain_update(inner)
            .finalize()
            .into()
    }

    pub fn user(&self, user_id: &str) -> UserHash {
        UserHash(self.mac(user_id.as_bytes()))
    }

    /// Reads `dir/hash.key`, or creates it with a fresh secret if it does not exist: atomically
    /// ([`crate::atomic_file::create_with_bytes`]: a temporary file of its own, synced, renamed only
    /// if `hash.key` still does not exist, the directory synced). If another process created it
    /// meanwhile, its secret is read and used: the secret never changes once written.
    pub fn load_or_create(dir: &Path) -> Result<KeyedHash, LedgerError> {
        let path = dir.join(KEY_FILE);
        if let Some(hash) = read_secret(&path)? {
            return Ok(hash);
        }
        let secret = KeyedHash::random_secret()?;
        match crate::atomic_file::create_with_bytes(&path, &secret) {
            Ok(()) => Ok(KeyedHash::new(secret)),
            Err(e) if e.step == Step::Rename && e.source.kind() == ErrorKind::AlreadyExists => {
                read_secret(&path)?
                    .ok_or_else(|| LedgerError::io(&path, "reading")(ErrorKind::NotFound.into()))
            }
            Err(e) => Err(LedgerError::io(
                &e.path,
                super::file::atomic_write_action(e.step, "writing"),
            )(e.source)),
        }
    }
}

/// The secret in `path`, `None` if there is no such file; a file of the wrong length is damage.
fn read_secret(path: &Path) -> Result<Option<KeyedHash>, LedgerError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LedgerError::io(path, "reading")(e)),
    };
    let secret: [u8; SECRET_BYTES] =
        bytes
            .as_slice()
            .try_into()
            .map_err(|_| LedgerError::Damaged {
                path: path.display().to_string().into(),
                offset: 0,
                rule: format!(
                    "the hash secret must be {SECRET_BYTES} bytes, the file has {}",
                    bytes.len()
                )
                .into(),
            })?;
    Ok(Some(KeyedHash::new(secret)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_matches_rfc_4231_for_a_32_byte_key() {
        // RFC 4231 has no 32-byte-key case; the expected value is Python's
        // `hmac.new(bytes(range(1, 33)), b"Hi There", hashlib.sha256)`.
        let mut secret = [0u8; 32];
        for (i, b) in secret.iter_mut().enumerate() {
            *b = i as u8 + 1;
        }
        let mac = KeyedHash::new(secret).mac(b"Hi There");
        assert_eq!(hex::encode(mac), EXPECTED_HI_THERE);
    }

    const EXPECTED_HI_THERE: &str =
        "45131af2422d643aed31b05ef8bbf08548235405e900cdd3308047abbbcab639";

    #[test]
    fn the_secret_is_created_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let a = KeyedHash::load_or_create(dir.path()).unwrap();
        let b = KeyedHash::load_or_create(dir.path()).unwrap();
        assert_eq!(a.user("alice"), b.user("alice"));
        assert_ne!(a.user("alice"), a.user("bob"));
        std::fs::write(dir.path().join(KEY_FILE), b"short").unwrap();
        let err = KeyedHash::load_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains("must be 32 bytes"), "{err}");
    }

    #[test]
    fn processes_creating_the_secret_at_once_all_get_the_first_ones() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let hashes: Vec<KeyedHash> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..4)
                    .map(|_| scope.spawn(|| KeyedHash::load_or_create(dir.path()).unwrap()))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let stored = std::fs::read(dir.path().join(KEY_FILE)).unwrap();
            for hash in &hashes {
                assert_eq!(hash.secret().as_slice(), stored.as_slice());
            }
            let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert_eq!(names.len(), 1, "no temporary file stays: {names:?}");
        }
    }
}
