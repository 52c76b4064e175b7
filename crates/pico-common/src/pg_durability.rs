//! The Postgres settings under which a committed transaction can be lost in a crash, and the
//! `allowUnsafe` URL parameter that accepts them. Shared by the metadata log and the Postgres
//! WAL, which both refuse such a server by default.

/// The URL parameter that accepts a server which may lose committed transactions.
pub const ALLOW_UNSAFE: &str = "allowUnsafe";

/// Splits `allowUnsafe=true|false` off `url`: returns the URL to connect with (the parameter
/// removed, every other one kept in order) and whether unsafe settings are accepted.
pub fn split_allow_unsafe(url: &str) -> Result<(String, bool), String> {
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
            return Err(format!("{ALLOW_UNSAFE} is given twice"));
        }
        allow = Some(match v {
            "true" => true,
            "false" => false,
            other => {
                return Err(format!(
                    "{ALLOW_UNSAFE} must be `true` or `false`, not `{other}`"
                ));
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

/// The first setting (name, value) under which a COMMIT can return before it is durable:
/// `fsync=off` (nothing reaches the disk reliably) or `synchronous_commit=off` (COMMIT returns
/// before its WAL record is flushed). `None` for a durable server.
pub fn unsafe_setting(fsync: &str, synchronous_commit: &str) -> Option<(&'static str, String)> {
    if fsync.trim().eq_ignore_ascii_case("off") {
        Some(("fsync", fsync.to_string()))
    } else if synchronous_commit.trim().eq_ignore_ascii_case("off") {
        Some(("synchronous_commit", synchronous_commit.to_string()))
    } else {
        None
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
            assert!(e.contains(ALLOW_UNSAFE), "{url}: {e}");
        }
    }

    #[test]
    fn only_settings_that_lose_commits_are_unsafe() {
        assert_eq!(unsafe_setting("on", "on"), None);
        // Locally durable before COMMIT returns: fine.
        assert_eq!(unsafe_setting("on", "local"), None);
        assert_eq!(unsafe_setting("on", "remote_write"), None);
        assert_eq!(unsafe_setting("off", "on"), Some(("fsync", "off".into())));
        assert_eq!(
            unsafe_setting("on", "OFF"),
            Some(("synchronous_commit", "OFF".into()))
        );
        assert_eq!(unsafe_setting("off", "off").map(|s| s.0), Some("fsync"));
    }
}
