//! The WAL's connection URL and the server settings a durable WAL needs.

use crate::PgWalError;

/// The URL parameter that accepts a server which may lose committed transactions.
pub const ALLOW_UNSAFE: &str = "allowUnsafe";

/// Splits `allowUnsafe=true|false` off `url`: returns the URL to connect with (the parameter
/// removed, every other one kept in order) and whether unsafe settings are accepted.
pub fn split_allow_unsafe(url: &str) -> Result<(String, bool), PgWalError> {
    let (head, query, fragment) = match url.split_once('?') {
        None => return Ok((url.to_string(), false)),
        Some((head, rest)) => match rest.split_once('#') {
            Some((q, f)) => (head, q, Some(f)),
            None => (head, rest, None),
        },
    };
    let mut allow = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != ALLOW_UNSAFE {
            kept.push(pair);
            continue;
        }
        if allow.is_some() {
            return Err(PgWalError::Url(format!("{ALLOW_UNSAFE} is given twice")));
        }
        allow = Some(match v {
            "true" => true,
            "false" => false,
            other => {
                return Err(PgWalError::Url(format!(
                    "{ALLOW_UNSAFE} must be `true` or `false`, not `{other}`"
                )));
            }
        });
    }
    let mut out = head.to_string();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    Ok((out, allow.unwrap_or(false)))
}

/// Refuses server settings under which a commit the WAL acknowledged can be lost in a crash
/// (`fsync=off`: nothing reaches the disk reliably; `synchronous_commit=off`: COMMIT returns
/// before its WAL record is flushed), unless `allow_unsafe`.
pub fn check_durability(
    fsync: &str,
    synchronous_commit: &str,
    allow_unsafe: bool,
) -> Result<(), PgWalError> {
    let unsafe_setting = if fsync.trim().eq_ignore_ascii_case("off") {
        Some(("fsync", fsync))
    } else if synchronous_commit.trim().eq_ignore_ascii_case("off") {
        Some(("synchronous_commit", synchronous_commit))
    } else {
        None
    };
    match unsafe_setting {
        Some((setting, value)) if allow_unsafe => {
            tracing::warn!(
                setting,
                value,
                "postgres WAL on a server that may lose acknowledged appends in a crash \
                 ({ALLOW_UNSAFE}=true)"
            );
            Ok(())
        }
        Some((setting, value)) => Err(PgWalError::Unsafe {
            setting,
            value: value.to_string(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_unsafe_is_stripped_and_other_parameters_kept() {
        let (u, a) = split_allow_unsafe("postgres://u:p@h:5432/db").unwrap();
        assert_eq!((u.as_str(), a), ("postgres://u:p@h:5432/db", false));
        let (u, a) = split_allow_unsafe("postgres://h/db?allowUnsafe=true").unwrap();
        assert_eq!((u.as_str(), a), ("postgres://h/db", true));
        let (u, a) =
            split_allow_unsafe("postgres://h/db?sslmode=disable&allowUnsafe=false&user=x#f")
                .unwrap();
        assert_eq!(
            (u.as_str(), a),
            ("postgres://h/db?sslmode=disable&user=x#f", false)
        );
        let (u, a) = split_allow_unsafe("postgres://h/db?sslmode=disable").unwrap();
        assert_eq!((u.as_str(), a), ("postgres://h/db?sslmode=disable", false));
    }

    #[test]
    fn a_bad_or_repeated_allow_unsafe_is_refused() {
        for url in [
            "postgres://h/db?allowUnsafe=yes",
            "postgres://h/db?allowUnsafe",
            "postgres://h/db?allowUnsafe=true&allowUnsafe=true",
        ] {
            let e = split_allow_unsafe(url).unwrap_err();
            assert!(matches!(e, PgWalError::Url(_)), "{url}: {e}");
            assert!(e.to_string().contains(ALLOW_UNSAFE), "{e}");
        }
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
