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
}
