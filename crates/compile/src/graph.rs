//! Task graphs (the paper's section 3.2 and Figure 3): per process, input
//! tasks that deserialise what a channel delivers, compute tasks that run
//! the process's rules, and output tasks that serialise onto channels,
//! joined by task channels. One graph is instantiated per client
//! connection, which gives data parallelism across connections; the tasks
//! of one graph run in parallel with each other, which gives task
//! parallelism within a connection.

use flick_check::{CheckedProgram, Ty};
use flick_syntax::ast::*;
use flick_syntax::format_expr;
use std::collections::{BTreeSet, HashMap};

/// A channel of the process, as the graph sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelSpec {
    pub name: String,
    /// A channel array (`[cmd/cmd] backends`).
    pub array: bool,
    /// The message type read from it, if it is read.
    pub input: Option<String>,
    /// The message type written to it, if it is written.
    pub output: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskKind {
    /// Reads bytes from a channel's connection(s) and parses messages.
    Input { channel: usize },
    /// Runs one item of the process body on each message it receives.
    Compute { item: usize, label: String },
    /// Serialises messages onto a channel's connection(s).
    Output { channel: usize },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskSpec {
    pub kind: TaskKind,
}

/// A task channel: `from` sends values to `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    /// The type of the values carried.
    pub carries: String,
}

/// The shape every instance of a process's task graph has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphTemplate {
    pub process: String,
    pub channels: Vec<ChannelSpec>,
    pub tasks: Vec<TaskSpec>,
    pub edges: Vec<Edge>,
}

impl GraphTemplate {
    pub fn channel(&self, name: &str) -> Option<usize> {
        self.channels.iter().position(|c| c.name == name)
    }
}

/// Which process channels each process item reads and writes.
struct Flow {
    reads: BTreeSet<String>,
    writes: BTreeSet<String>,
}

/// Builds the task graph template of every process of a checked program.
pub fn task_graphs(program: &Program, checked: &CheckedProgram) -> Vec<GraphTemplate> {
    let funs: HashMap<&str, &FunDecl> = program
        .decls
        .iter()
        .filter_map(|d| match d {
            Decl::Fun(f) => Some((f.name.name.as_str(), f)),
            _ => None,
        })
        .collect();
    let mut writes_memo = HashMap::new();
    program
        .decls
        .iter()
        .filter_map(|d| match d {
            Decl::Proc(p) => Some(p),
            _ => None,
        })
        .map(|p| graph(p, checked, &funs, &mut writes_memo))
        .collect()
}

fn type_name(t: &Option<Box<Ty>>) -> Option<String> {
    t.as_ref().map(|t| t.to_string())
}

fn graph<'a>(
    p: &ProcDecl,
    checked: &CheckedProgram,
    funs: &HashMap<&'a str, &'a FunDecl>,
    memo: &mut HashMap<String, BTreeSet<usize>>,
) -> GraphTemplate {
    let info = checked.processes.iter().find(|q| q.name == p.name.name);
    let channels: Vec<ChannelSpec> = info
        .map(|i| i.channels.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|(name, ty)| match ty {
            Ty::Chan(c) => Some(ChannelSpec {
                name: name.clone(),
                array: false,
                input: type_name(&c.input),
                output: type_name(&c.output),
            }),
            Ty::ChanArray(c, _) => Some(ChannelSpec {
                name: name.clone(),
                array: true,
                input: type_name(&c.input),
                output: type_name(&c.output),
            }),
            _ => None,
        })
        .collect();
    let mut tasks = Vec::new();
    let mut input_task = HashMap::new();
    let mut output_task = HashMap::new();
    for (i, c) in channels.iter().enumerate() {
        if c.input.is_some() {
            input_task.insert(c.name.clone(), tasks.len());
            tasks.push(TaskSpec {
                kind: TaskKind::Input { channel: i },
            });
        }
    }
    let mut edges = Vec::new();
    let mut computes = Vec::new();
    for (item_index, item) in p.items.iter().enumerate() {
        let (label, flow) = match item {
            ProcItem::State(_) => continue,
            ProcItem::Rule(r) => {
                let mut label = format_expr(&r.source, 0, 0);
                for s in &r.steps {
                    label.push_str(" => ");
                    label.push_str(&format_expr(s, 0, 0));
                }
                (label, rule_flow(r, funs, memo))
            }
            ProcItem::Guarded(g) => {
                let mut flow = Flow {
                    reads: BTreeSet::new(),
                    writes: BTreeSet::new(),
                };
                expr_flow(&g.cond, funs, memo, &mut flow);
                block_flow(&g.body, funs, memo, &mut flow);
                (format!("if {}", format_expr(&g.cond, 0, 0)), flow)
            }
            ProcItem::Handler(h) => {
                let mut flow = Flow {
                    reads: BTreeSet::new(),
                    writes: BTreeSet::new(),
                };
                block_flow(&h.body, funs, memo, &mut flow);
                flow.reads.insert(h.channel.name.clone());
                (format!("on {}({})", h.event.name, h.channel.name), flow)
            }
        };
        let me = tasks.len();
        tasks.push(TaskSpec {
            kind: TaskKind::Compute {
                item: item_index,
                label,
            },
        });
        computes.push((me, flow));
    }
    for (i, c) in channels.iter().enumerate() {
        if c.output.is_some() {
            output_task.insert(c.name.clone(), tasks.len());
            tasks.push(TaskSpec {
                kind: TaskKind::Output { channel: i },
            });
        }
    }
    for (me, flow) in computes {
        for r in &flow.reads {
            if let Some(&from) = input_task.get(r) {
                let carries = channels
                    .iter()
                    .find(|c| &c.name == r)
                    .and_then(|c| c.input.clone());
                edges.push(Edge {
                    from,
                    to: me,
                    carries: carries.unwrap_or_default(),
                });
            }
        }
        for w in &flow.writes {
            if let Some(&to) = output_task.get(w) {
                let carries = channels
                    .iter()
                    .find(|c| &c.name == w)
                    .and_then(|c| c.output.clone());
                edges.push(Edge {
                    from: me,
                    to,
                    carries: carries.unwrap_or_default(),
                });
            }
        }
    }
    GraphTemplate {
        process: p.name.name.clone(),
        channels,
        tasks,
        edges,
    }
}

/// The process channel an expression names: `c` or `c[i]`.
fn channel_of(e: &Expr) -> Option<&str> {
    match &e.kind {
        ExprKind::Var(v) => Some(&v.name),
        ExprKind::Index(b, _) => channel_of(b),
        _ => None,
    }
}

fn rule_flow<'a>(
    r: &Rule,
    funs: &HashMap<&'a str, &'a FunDecl>,
    memo: &mut HashMap<String, BTreeSet<usize>>,
) -> Flow {
    let mut flow = Flow {
        reads: BTreeSet::new(),
        writes: BTreeSet::new(),
    };
    if let Some(c) = channel_of(&r.source) {
        flow.reads.insert(c.to_string());
    }
    for step in &r.steps {
        match &step.kind {
            ExprKind::Call(..) => expr_flow(step, funs, memo, &mut flow),
            _ => {
                if let Some(c) = channel_of(step) {
                    flow.writes.insert(c.to_string());
                }
            }
        }
    }
    flow
}

fn block_flow<'a>(
    b: &Block,
    funs: &HashMap<&'a str, &'a FunDecl>,
    memo: &mut HashMap<String, BTreeSet<usize>>,
    flow: &mut Flow,
) {
    for s in &b.stmts {
        match &s.kind {
            StmtKind::Let { value, .. } | StmtKind::Expr(value) => {
                expr_flow(value, funs, memo, flow)
            }
            StmtKind::Assign { place, value } => {
                expr_flow(place, funs, memo, flow);
                expr_flow(value, funs, memo, flow);
            }
            StmtKind::Send { value, channel } => {
                expr_flow(value, funs, memo, flow);
                if let Some(c) = channel_of(channel) {
                    flow.writes.insert(c.to_string());
                }
            }
            StmtKind::If {
                cond,
                then,
                otherwise,
            } => {
                expr_flow(cond, funs, memo, flow);
                block_flow(then, funs, memo, flow);
                if let Some(o) = otherwise {
                    block_flow(o, funs, memo, flow);
                }
            }
        }
    }
}

/// Channels an expression reads (`foldt on`) and writes (through calls).
fn expr_flow<'a>(
    e: &Expr,
    funs: &HashMap<&'a str, &'a FunDecl>,
    memo: &mut HashMap<String, BTreeSet<usize>>,
    flow: &mut Flow,
) {
    match &e.kind {
        ExprKind::Call(f, args) => {
            if let Some(fun) = funs.get(f.name.as_str()) {
                for i in fun_writes(fun, funs, memo) {
                    if let Some(c) = args.get(i).and_then(channel_of) {
                        flow.writes.insert(c.to_string());
                    }
                }
            }
            args.iter().for_each(|a| expr_flow(a, funs, memo, flow));
        }
        ExprKind::Foldt(f) => {
            if let Some(c) = channel_of(&f.channels) {
                flow.reads.insert(c.to_string());
            }
            block_flow(&f.body, funs, memo, flow);
        }
        ExprKind::Unary(_, x) | ExprKind::Field(x, _) => expr_flow(x, funs, memo, flow),
        ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
            expr_flow(a, funs, memo, flow);
            expr_flow(b, funs, memo, flow);
        }
        ExprKind::Tuple(es) | ExprKind::List(es) => {
            es.iter().for_each(|x| expr_flow(x, funs, memo, flow))
        }
        _ => {}
    }
}

/// The indices of a function's parameters that it (or what it calls)
/// writes to. Functions are never recursive, so this always ends.
fn fun_writes<'a>(
    f: &FunDecl,
    funs: &HashMap<&'a str, &'a FunDecl>,
    memo: &mut HashMap<String, BTreeSet<usize>>,
) -> BTreeSet<usize> {
    if let Some(w) = memo.get(&f.name.name) {
        return w.clone();
    }
    memo.insert(f.name.name.clone(), BTreeSet::new());
    let mut flow = Flow {
        reads: BTreeSet::new(),
        writes: BTreeSet::new(),
    };
    block_flow(&f.body, funs, memo, &mut flow);
    let written: BTreeSet<usize> = f
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| flow.writes.contains(&p.name.name))
        .map(|(i, _)| i)
        .collect();
    memo.insert(f.name.name.clone(), written.clone());
    written
}

/// The graph as Graphviz DOT: inputs and outputs as boxes, computations as
/// ellipses, edges labelled with the type they carry. A process's rules
/// are drawn inside one box, its compute task: at run time they run in
/// turn in one task per instance, because they share what the instance
/// knows of its requests and replies (which reply answers which request,
/// the order replies go back in), which then needs no lock.
pub fn to_dot(graphs: &[GraphTemplate]) -> String {
    let mut out =
        String::from("digraph flick {\n  rankdir=LR;\n  node [fontname=\"Helvetica\"];\n");
    for (g, graph) in graphs.iter().enumerate() {
        out.push_str(&format!(
            "  subgraph cluster_{g} {{\n    label=\"process {}\";\n",
            escape(&graph.process)
        ));
        let computes = graph
            .tasks
            .iter()
            .filter(|t| matches!(t.kind, TaskKind::Compute { .. }))
            .count();
        if computes > 0 {
            out.push_str(&format!(
                "    subgraph cluster_{g}_compute {{\n      label=\"compute task ({computes} rule{})\";\n      style=rounded;\n",
                if computes == 1 { "" } else { "s" }
            ));
            for (i, t) in graph.tasks.iter().enumerate() {
                if let TaskKind::Compute { label, .. } = &t.kind {
                    out.push_str(&format!(
                        "      g{g}_t{i} [label=\"{}\", shape=ellipse];\n",
                        escape(label)
                    ));
                }
            }
            out.push_str("    }\n");
        }
        for (i, t) in graph.tasks.iter().enumerate() {
            let (label, shape) = match &t.kind {
                TaskKind::Input { channel } => {
                    let c = &graph.channels[*channel];
                    (
                        format!("input: {}{}", c.name, if c.array { "[i]" } else { "" }),
                        "box",
                    )
                }
                // Drawn inside the compute task above.
                TaskKind::Compute { .. } => continue,
                TaskKind::Output { channel } => {
                    let c = &graph.channels[*channel];
                    (
                        format!("output: {}{}", c.name, if c.array { "[i]" } else { "" }),
                        "box",
                    )
                }
            };
            out.push_str(&format!(
                "    g{g}_t{i} [label=\"{}\", shape={shape}];\n",
                escape(&label)
            ));
        }
        for e in &graph.edges {
            out.push_str(&format!(
                "    g{g}_t{} -> g{g}_t{} [label=\"{}\"];\n",
                e.from,
                e.to,
                escape(&e.carries)
            ));
        }
        out.push_str("  }\n");
    }
    out.push_str("}\n");
    out
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}
