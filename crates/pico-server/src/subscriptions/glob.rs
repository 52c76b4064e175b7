//! Subscription patterns over stream-root-relative paths: `*` matches exactly one segment, `**`
//! zero or more segments. A `*` inside a segment (`user-*`) matches any run of characters within
//! that one segment (a superset of the spec's whole-segment rule).
//!
//! A [`Pattern`] is split into segments once, when parsed: matching it against a path (done for
//! every subscription on every append) allocates nothing.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A parsed pattern. Compares, hashes into a config and serializes as its source text.
#[derive(Clone)]
pub struct Pattern {
    source: String,
    segs: Vec<Seg>,
}

#[derive(Debug, Clone)]
enum Seg {
    /// `**`: zero or more segments.
    AnySegments,
    /// A segment without `*`: equal text.
    Literal(String),
    /// A segment with `*`: the literal parts around its stars (at least two, maybe empty).
    Wild(Vec<String>),
}

impl Pattern {
    /// Leading/trailing slashes and empty segments are ignored.
    pub fn new(source: &str) -> Pattern {
        let segs = segments(source)
            .map(|seg| match seg {
                "**" => Seg::AnySegments,
                s if s.contains('*') => Seg::Wild(s.split('*').map(str::to_string).collect()),
                s => Seg::Literal(s.to_string()),
            })
            .collect();
        Pattern {
            source: source.to_string(),
            segs,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether `path` matches. Greedy with one backtrack point (the last `**` seen): every other
    /// segment matches exactly one path segment, so retrying only the last `**` is enough, in
    /// O(|pattern| · |path|) time whatever the number of `**`, and without allocating.
    pub fn matches(&self, path: &str) -> bool {
        let mut p = 0;
        let mut rest = path;
        // (pattern index after the last `**`, path remainder it stopped absorbing at).
        let mut star: Option<(usize, &str)> = None;
        loop {
            let (seg, after) = next_segment(rest);
            match (self.segs.get(p), seg) {
                (Some(Seg::AnySegments), _) => {
                    p += 1;
                    star = Some((p, rest));
                    continue;
                }
                (Some(pat), Some(seg)) if pat.matches_one(seg) => {
                    p += 1;
                    rest = after;
                    continue;
                }
                (None, None) => return true,
                _ => {}
            }
            // Mismatch: the last `**` absorbs one more segment, or nothing can match.
            let Some((star_p, star_rest)) = star else {
                return false;
            };
            let (Some(_), after) = next_segment(star_rest) else {
                return false;
            };
            p = star_p;
            rest = after;
            star = Some((star_p, after));
        }
    }

    /// A prefix every matching path starts with (used to narrow stream listings): the literal
    /// segments before the first wildcard, each followed by `/`; a pattern without wildcards is
    /// its own prefix.
    pub fn literal_prefix(&self) -> String {
        let literals: Vec<&str> = self
            .segs
            .iter()
            .map_while(|s| match s {
                Seg::Literal(l) => Some(l.as_str()),
                _ => None,
            })
            .collect();
        if literals.len() == self.segs.len() {
            return literals.join("/");
        }
        literals.iter().map(|l| format!("{l}/")).collect()
    }
}

impl Seg {
    /// Whether this (non-`**`) segment pattern matches one path segment.
    fn matches_one(&self, seg: &str) -> bool {
        match self {
            Seg::AnySegments => true,
            Seg::Literal(l) => l == seg,
            Seg::Wild(parts) => wild_matches(parts, seg),
        }
    }
}

/// One segment against the literal parts of a segment pattern split at its `*`s.
fn wild_matches(parts: &[String], seg: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() < 2
        || seg.len() < first.len() + last.len()
        || !seg.starts_with(first.as_str())
        || !seg.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &seg[first.len()..seg.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid.as_str()) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// The first non-empty segment of `s` and what follows it (`None` once only slashes remain).
fn next_segment(s: &str) -> (Option<&str>, &str) {
    let s = s.trim_start_matches('/');
    if s.is_empty() {
        return (None, s);
    }
    match s.find('/') {
        Some(i) => (Some(&s[..i]), &s[i..]),
        None => (Some(s), ""),
    }
}

fn segments(s: &str) -> impl Iterator<Item = &str> {
    s.split('/').filter(|seg| !seg.is_empty())
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.source == other.source
    }
}

impl Eq for Pattern {}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.source, f)
    }
}

impl Serialize for Pattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

/// Stored configs load whatever their pattern (limits apply when a config is parsed from a
/// request, see `Config::parse`).
impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Pattern, D::Error> {
        Ok(Pattern::new(&String::deserialize(d)?))
    }
}

/// Whether `path` matches `pattern` (parses the pattern: for one-off checks).
pub fn matches(pattern: &str, path: &str) -> bool {
    Pattern::new(pattern).matches(path)
}

/// See [`Pattern::literal_prefix`].
pub fn literal_prefix(pattern: &str) -> String {
    Pattern::new(pattern).literal_prefix()
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

    /// The dynamic-programming matcher this one replaced: the reference semantics.
    fn reference(pattern: &str, path: &str) -> bool {
        let pat: Vec<&str> = segments(pattern).collect();
        let segs: Vec<&str> = segments(path).collect();
        let mut ok = vec![false; segs.len() + 1];
        ok[segs.len()] = true;
        for seg in pat.iter().rev() {
            let mut next = vec![false; segs.len() + 1];
            if *seg == "**" {
                for j in (0..=segs.len()).rev() {
                    next[j] = ok[j] || (j < segs.len() && next[j + 1]);
                }
            } else {
                let one = Pattern::new(seg);
                for j in 0..segs.len() {
                    next[j] = ok[j + 1] && one.segs[0].matches_one(segs[j]);
                }
            }
            ok = next;
        }
        ok[0]
    }

    #[test]
    fn agrees_with_the_reference_matcher_on_every_small_case() {
        let atoms = ["a", "b", "*", "**", "a*"];
        let mut patterns = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = patterns
                .iter()
                .flat_map(|p| atoms.iter().map(move |a| format!("{p}/{a}")))
                .collect();
            patterns.extend(longer);
        }
        patterns.sort();
        patterns.dedup();
        let mut paths = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = paths
                .iter()
                .flat_map(|p| ["a", "b", "ab"].iter().map(move |s| format!("{p}/{s}")))
                .collect();
            paths.extend(longer);
        }
        paths.sort();
        paths.dedup();
        for pattern in &patterns {
            let compiled = Pattern::new(pattern);
            for path in &paths {
                assert_eq!(
                    compiled.matches(path),
                    reference(pattern, path),
                    "{pattern:?} vs {path:?}"
                );
            }
        }
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
