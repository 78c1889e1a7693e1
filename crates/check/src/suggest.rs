//! "Did you mean" suggestions for misspelt names.

/// The candidate closest to `name` by edit distance, if close enough to be
/// a plausible typo.
pub fn closest(name: &str, candidates: impl IntoIterator<Item = String>) -> Option<String> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .filter(|c| c != name)
        .map(|c| (edit_distance(name, &c), c))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, c)| c)
}

/// Up to five of `candidates` that look like `name`: near it by edit
/// distance, containing it or contained in it, or sharing a word of three
/// letters or more (`str_contains` and `contains`, `startswith` and
/// `starts_with`), nearest first.
pub fn similar<'c>(name: &str, candidates: &[&'c str]) -> Vec<&'c str> {
    let lower = name.to_ascii_lowercase();
    let squashed = |s: &str| s.replace('_', "");
    let words = |s: &str| -> Vec<String> {
        s.split('_')
            .filter(|w| w.len() >= 3)
            .map(str::to_string)
            .collect()
    };
    let mine = words(&lower);
    let limit = (name.chars().count() / 2).max(2);
    let mut found: Vec<(usize, &str)> = candidates
        .iter()
        .filter(|c| **c != name)
        .filter_map(|c| {
            let d = edit_distance(&lower, c);
            let near = d <= limit
                || squashed(&lower).contains(&squashed(c))
                || squashed(c).contains(&squashed(&lower))
                || words(c).iter().any(|w| mine.contains(w));
            near.then_some((d, *c))
        })
        .collect();
    found.sort();
    found.into_iter().take(5).map(|(_, c)| c).collect()
}

/// Edits (insertions, deletions, substitutions and swaps of two adjacent
/// characters) turning `a` into `b`: the optimal string alignment distance,
/// so that a transposition such as `hsah` for `hash` counts as one typo.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Rows i-2, i-1 and i of the distance table.
    let mut before: Vec<usize> = Vec::new();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 0..a.len() {
        let mut cur = vec![i + 1];
        for j in 0..b.len() {
            let sub = prev[j] + usize::from(a[i] != b[j]);
            let mut d = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
            if i > 0 && j > 0 && a[i] == b[j - 1] && a[i - 1] == b[j] {
                d = d.min(before[j - 1] + 1);
            }
            cur.push(d);
        }
        before = std::mem::replace(&mut prev, cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    #[test]
    fn suggests_near_names_only() {
        let names = || ["backends".to_string(), "client".to_string()];
        assert_eq!(super::closest("backend", names()), Some("backends".into()));
        assert_eq!(super::closest("zzz", names()), None);
        assert_eq!(super::closest("clinet", names()), Some("client".into()));
    }

    #[test]
    fn similar_names_share_words_or_letters() {
        let b = crate::builtins::BUILTINS;
        assert_eq!(super::similar("startswith", b)[0], "starts_with");
        assert!(super::similar("str_contains", b).contains(&"contains"));
        assert!(super::similar("tolower", b).contains(&"lower"));
        assert_eq!(super::similar("toint", b)[0], "to_int");
        assert!(super::similar("substr", b).contains(&"substring"));
        assert!(super::similar("qqqqqqqq", b).is_empty());
    }
}
