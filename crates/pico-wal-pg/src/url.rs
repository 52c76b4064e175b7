//! The WAL's connection URL and the server settings a durable WAL needs.

use crate::PgWalError;

pub use pico_common::pg_durability::ALLOW_UNSAFE;

/// Splits `allowUnsafe=true|false` off `url` ([`pico_common::pg_durability::split_allow_unsafe`]).
pub fn split_allow_unsafe(url: &str) -> Result<(String, bool), PgWalError> {
    pico_common::pg_durability::split_allow_unsafe(url).map_err(PgWalError::Url)
}

/// Refuses server settings under which a commit the WAL acknowledged can be lost in a crash
/// (`fsync=off`: nothing reaches the disk reliably; `synchronous_commit=off`: COMMIT returns
/// before its WAL record is flushed), unless `allow_unsafe`.
pub fn check_durability(
    fsync: &str,
    synchronous_commit: &str,
    allow_unsafe: bool,
) -> Result<(), PgWalError> {
    match pico_common::pg_durability::unsafe_setting(fsync, synchronous_commit) {
        Some((setting, value)) if allow_unsafe => {
            tracing::warn!(
                setting,
                value,
                "postgres WAL on a server that may lose acknowledged appends in a crash \
                 ({ALLOW_UNSAFE}=true)"
            );
            Ok(())
        }
        Some((setting, value)) => Err(PgWalError::Unsafe { setting, value }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_allow_unsafe_is_a_url_error() {
        let e = split_allow_unsafe("postgres://h/db?allowUnsafe=yes").unwrap_err();
        assert!(matches!(e, PgWalError::Url(_)), "{e}");
        assert!(e.to_string().contains(ALLOW_UNSAFE), "{e}");
        let (u, a) = split_allow_unsafe("postgres://h/db?allowUnsafe=true").unwrap();
        assert_eq!((u.as_str(), a), ("postgres://h/db", true));
    }

    #[test]
    fn unsafe_settings_are_refused_unless_allowed() {
        assert!(check_durability("on", "on", false).is_ok());
        // Locally durable before COMMIT returns: fine.
        assert!(check_durability("on", "local", false).is_ok());
        assert!(check_durability("on", "remote_write", false).is_ok());
        for (f, s, which) in [
            ("off", "on", "fsync"),
            ("on", "off", "synchronous_commit"),
            ("off", "off", "fsync"),
        ] {
            let e = check_durability(f, s, false).unwrap_err();
            assert!(
                matches!(&e, PgWalError::Unsafe { setting, .. } if *setting == which),
                "{e}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains(which) && msg.contains("allowUnsafe=true"),
                "{msg}"
            );
            assert!(check_durability(f, s, true).is_ok());
        }
    }
}
