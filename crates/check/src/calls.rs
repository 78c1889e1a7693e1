//! Termination: user functions never call themselves, directly or through
//! a cycle. With iteration limited to fold/map/filter over bounded lists,
//! this makes every checked program terminate.

use crate::checker::Checker;
use flick_span::Diagnostic;

impl Checker<'_> {
    pub(crate) fn check_recursion(&mut self) {
        let n = self.fun_decls.len();
        let mut edges: Vec<Vec<(usize, flick_span::Span)>> = vec![Vec::new(); n];
        for &(from, to, span) in &self.calls {
            if !edges[from].iter().any(|(t, _)| *t == to) {
                edges[from].push((to, span));
            }
        }
        for (f, out) in edges.iter().enumerate() {
            if let Some((_, span)) = out.iter().find(|(t, _)| *t == f) {
                let name = &self.fun_decls[f].name.name;
                self.diags.push(
                    Diagnostic::error("E0401", format!("`{name}` calls itself"), *span)
                        .label("recursive call")
                        .hint("Flick functions cannot be recursive; use fold over a bounded list"),
                );
            }
        }
        for cycle in cycles(&edges) {
            let names: Vec<&str> = cycle
                .iter()
                .chain(std::iter::once(&cycle[0]))
                .map(|f| self.fun_decls[*f].name.name.as_str())
                .collect();
            let first = cycle[0];
            let next = cycle[1];
            let span = edges[first].iter().find(|(t, _)| *t == next).unwrap().1;
            let message = if cycle.len() == 2 {
                format!("`{}` and `{}` call each other", names[0], names[1])
            } else {
                format!(
                    "functions `{}` call each other in a cycle",
                    names[..cycle.len()].join("`, `")
                )
            };
            let mut d = Diagnostic::error("E0402", message, span).label(names.join(" -> "));
            for w in cycle
                .windows(2)
                .skip(1)
                .chain(std::iter::once(&[cycle[cycle.len() - 1], first][..]))
            {
                let s = edges[w[0]].iter().find(|(t, _)| *t == w[1]).unwrap().1;
                d = d.also(s, "");
            }
            self.diags.push(d.hint(
                "Flick functions cannot be recursive, directly or through other functions; use fold over a bounded list",
            ));
        }
    }
}

/// One cycle of two or more functions per strongly connected component,
/// found with Tarjan's algorithm, smallest function index first.
fn cycles(edges: &[Vec<(usize, flick_span::Span)>]) -> Vec<Vec<usize>> {
    struct Tarjan<'a> {
        edges: &'a [Vec<(usize, flick_span::Span)>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        sccs: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &(w, _) in &self.edges[v] {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut scc = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack[w] = false;
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                self.sccs.push(scc);
            }
        }
    }
    let n = edges.len();
    let mut t = Tarjan {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        sccs: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    let mut out = Vec::new();
    for scc in t.sccs.into_iter().filter(|s| s.len() > 1) {
        // The shortest cycle through the smallest member, found breadth
        // first; one exists because the component is strongly connected.
        let start = *scc.iter().min().unwrap();
        let mut parent: Vec<Option<usize>> = vec![None; n];
        let mut queue = std::collections::VecDeque::from([start]);
        let mut seen = vec![start];
        let mut last = start;
        'search: while let Some(u) = queue.pop_front() {
            for &(w, _) in &edges[u] {
                if w == start && u != start {
                    last = u;
                    break 'search;
                }
                if w != start && scc.contains(&w) && !seen.contains(&w) {
                    seen.push(w);
                    parent[w] = Some(u);
                    queue.push_back(w);
                }
            }
        }
        let mut path = vec![last];
        while let Some(p) = parent[*path.last().unwrap()] {
            path.push(p);
        }
        path.reverse();
        out.push(path);
    }
    out.sort();
    out
}
