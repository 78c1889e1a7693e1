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

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
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
    }
}
