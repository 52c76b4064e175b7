//! Subscription patterns over stream-root-relative paths: `*` matches exactly one segment, `**`
//! zero or more segments. A `*` inside a segment (`user-*`) matches any run of characters within
//! that one segment (a superset of the spec's whole-segment rule).

/// Whether `path` matches `pattern`. Leading/trailing slashes and empty segments are ignored.
pub fn matches(pattern: &str, path: &str) -> bool {
    let pat: Vec<&str> = segments(pattern).collect();
    let segs: Vec<&str> = segments(path).collect();
    match_from(&pat, &segs)
}

/// A prefix every matching path starts with (used to narrow stream listings): the literal
/// segments before the first wildcard, each followed by `/`; a pattern without wildcards is its
/// own prefix.
pub fn literal_prefix(pattern: &str) -> String {
    if !pattern.contains('*') {
        return segments(pattern).collect::<Vec<_>>().join("/");
    }
    let mut out = String::new();
    for seg in segments(pattern) {
        if seg.contains('*') {
            break;
        }
        out.push_str(seg);
        out.push('/');
    }
    out
}

fn segments(s: &str) -> impl Iterator<Item = &str> {
    s.split('/').filter(|seg| !seg.is_empty())
}

/// Dynamic programming over (pattern index, path index): O(|pat| · |path|) whatever the number
/// of `**` (a backtracking matcher is exponential in it, and patterns come from clients).
fn match_from(pat: &[&str], path: &[&str]) -> bool {
    // ok[j] = pat[i..] matches path[j..], computed for i from the end.
    let mut ok = vec![false; path.len() + 1];
    ok[path.len()] = true;
    for seg in pat.iter().rev() {
        let mut next = vec![false; path.len() + 1];
        if *seg == "**" {
            // Zero segments (ok[j]) or one more (next[j + 1]).
            for j in (0..=path.len()).rev() {
                next[j] = ok[j] || (j < path.len() && next[j + 1]);
            }
        } else {
            for j in 0..path.len() {
                next[j] = ok[j + 1] && segment_matches(seg, path[j]);
            }
        }
        ok = next;
    }
    ok[0]
}

/// One segment against a segment pattern where `*` is any run of characters.
fn segment_matches(pat: &str, seg: &str) -> bool {
    if !pat.contains('*') {
        return pat == seg;
    }
    let parts: Vec<&str> = pat.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if seg.len() < first.len() + last.len() || !seg.starts_with(first) || !seg.ends_with(last) {
        return false;
    }
    let mut rest = &seg[first.len()..seg.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_double_stars_stay_fast() {
        let path = vec!["a"; 500].join("/");
        let pattern = vec!["**"; 40].join("/") + "/z";
        // A backtracking matcher would not finish these in any useful time.
        assert!(!matches(&pattern, &path));
        assert!(matches(&(vec!["**"; 40].join("/") + "/a"), &path));
    }

    #[test]
    fn single_star_is_one_segment() {
        assert!(matches("events/*", "events/a"));
        assert!(!matches("events/*", "events"));
        assert!(!matches("events/*", "events/a/b"));
        assert!(!matches("events/*", "other/a"));
        assert!(matches("*/x", "a/x"));
    }

    #[test]
    fn double_star_is_zero_or_more_segments() {
        assert!(matches("events/**", "events"));
        assert!(matches("events/**", "events/a"));
        assert!(matches("events/**", "events/a/b/c"));
        assert!(matches("**/log", "log"));
        assert!(matches("**/log", "a/b/log"));
        assert!(!matches("**/log", "a/b/logs"));
        assert!(matches("a/**/z", "a/z"));
        assert!(matches("a/**/z", "a/b/c/z"));
        assert!(!matches("a/**/z", "a/b/c"));
        assert!(matches("**", "anything/at/all"));
    }

    #[test]
    fn literals_and_slashes() {
        assert!(matches("/events/a/", "events/a"));
        assert!(!matches("events/a", "events/ab"));
    }

    #[test]
    fn star_inside_a_segment() {
        assert!(matches("events/user-*", "events/user-42"));
        assert!(matches("events/*-log", "events/api-log"));
        assert!(matches("events/a*b*c", "events/aXbYc"));
        assert!(!matches("events/a*b*c", "events/aXcYb"));
        assert!(!matches("events/user-*", "events/admin-1"));
        assert!(!matches("events/user-*", "events/user-1/x"));
    }

    #[test]
    fn literal_prefix_stops_at_the_first_wildcard() {
        assert_eq!(literal_prefix("events/*"), "events/");
        assert_eq!(literal_prefix("a/b/**/c"), "a/b/");
        assert_eq!(literal_prefix("**"), "");
        assert_eq!(literal_prefix("x/user-*"), "x/");
        assert_eq!(literal_prefix("/exact/path/"), "exact/path");
    }
}
