//! Rust source for a grammar's parsers: each unit's parse plan written out
//! as straight-line code, so that a grammar compiled ahead of time (the
//! stock grammars, by `flick-grammars`) parses without interpretation.
//!
//! A generated parser is a fast path, not a second engine. It reads one
//! message whose bytes are all in the buffer, from its first byte, and
//! returns the message's length exactly when the interpreter would answer
//! `Done` for the same bytes, with the same slots. A message whose head
//! ends at a non-empty streamed `bytes` field (an HTTP body with a
//! Content-Length) in the unit's own block or last in a switch arm there
//! is parsed up to it and [`HEAD`]: the interpreter takes over from that
//! field with the code's slots, as if it had parsed the head itself.
//! Anything else (too few bytes, other streams, a field that fails its
//! check) is [`FALLBACK`]: the interpreter parses the message instead and
//! says what is wrong. Errors, resumption and streaming stay in one place.
//!
//! Expressions are written out too, calling the evaluator's own builtin
//! functions ([`rt`](crate::rt)); one the generator does not know is
//! handed to the evaluator whole, over the slots written so far. The
//! generated module carries a fingerprint of its code and of those
//! expressions; a grammar loaded at run time uses it only if generating
//! code from that grammar gives the same fingerprint, so a changed grammar
//! never meets stale code. A unit the generator cannot write out at all is
//! listed in [`Generated::skipped`] and interpreted.
//!
//! Generated code leaves no value of an earlier message behind: on every
//! path it sets or unsets each slot it may set (the arms of a switch not
//! taken are unset, and a list unsets the elements the last message had
//! beyond its own count), so a parser clears nothing between messages it
//! parses.
//!
//! Each unit's function is compiled over two constants: `VIEW`, whether a
//! field is stored only if the parser's view keeps it, and `TRACK`,
//! whether arm bits and the highest slot set are kept (not for the rows of
//! a batch of a small unit, [`tracks_rows`]).
//!
//! [`FALLBACK`]: crate::rt::FALLBACK
//! [`HEAD`]: crate::rt::HEAD
//! [`tracks_rows`]: crate::rt::tracks_rows

pub use crate::field_consts::field_consts;
use crate::int_expr::{lower, ConstOp, IntExpr, Node, Operand};
use crate::plan::{Case, Cases, StepKind, ValExpr};
use crate::program::{BlockId, Builtin, CExpr, Elem, Len, OpKind, Scalar, Stop};
use crate::Grammar;
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// The generated source of a grammar's parsers, and what a grammar loaded
/// at run time needs to use them.
pub struct Generated {
    /// A Rust module's items: one function per unit, a
    /// `pub static GRAMMAR: CompiledGrammar` naming them, and every
    /// field as a constant ([`field_consts`]).
    pub code: String,
    pub fingerprint: u64,
    /// Per unit, by unit id; `None` for a unit with no generated parser.
    pub units: Vec<Option<GeneratedUnit>>,
    /// The units with no generated parser, and why.
    pub skipped: Vec<(String, &'static str)>,
}

pub struct GeneratedUnit {
    /// The expressions the code hands to the evaluator, by index.
    pub exprs: Vec<CExpr>,
    /// Whether the code agrees with the interpreter under every view. It
    /// does when every slot an expression reads is one every view keeps.
    pub views: bool,
    /// Whether the code can leave the fields read in place unstored
    /// ([`Parser::in_place`](crate::Parser::in_place)): it does when it
    /// reads them only from locals.
    pub in_place: bool,
}

/// Generates the parsers of every unit of `g`.
pub fn generate(g: &Grammar) -> Generated {
    let mut fns = String::new();
    let mut units = Vec::new();
    let mut skipped = Vec::new();
    let mut table = String::new();
    for (id, info) in g.units.iter().enumerate() {
        let mut u = UnitGen {
            g,
            out: String::new(),
            exprs: Vec::new(),
            min_view: g.view_floor(id),
            in_place: g.fixed_at[id].iter().map(Option::is_some).collect(),
            in_place_ok: true,
            views: true,
            next: 0,
            depth: 0,
            fused: Vec::new(),
            writes: Vec::new(),
            arm_bits: 0,
            arm_stack: Vec::new(),
            setters: HashMap::new(),
            unwitnessed: HashSet::new(),
            unset_groups: Vec::new(),
            list_elems: HashMap::new(),
            ints: HashMap::new(),
            high_bound: 0,
            high_dynamic: false,
            path: Vec::new(),
            arm_head: None,
        };
        let mut scope = Scope {
            base: Base::Static(0),
            vals: HashMap::new(),
            assigned: HashSet::new(),
        };
        match u.block(info.block, &mut scope) {
            Ok(()) => {
                let name = format!("unit_{id}");
                // Inlined into the batch loop, so that a run of small
                // messages costs no call each.
                let _ = write!(
                    fns,
                    "/// `{unit}`.\n#[allow(unused_mut, unused_variables, unreachable_code, unused_assignments, unused_parens, clippy::all)]\n\
                     #[inline(always)]\n\
                     fn {name}<const VIEW: bool, const TRACK: bool, const IN_PLACE: bool>(buf: &[u8], s: &mut [Slot], cx: &mut Cx) -> usize {{\n\
                     if s.len() < {slots} {{ cx.high = 0; return FALLBACK; }}\n\
                     let mut pos = 0usize;\nlet mut high = 0usize;\n{body}\
                     if TRACK {{ cx.high = high; }}\npos\n}}\n\n\
                     /// `{unit}` in a batch's loop.\n\
                     struct Rows{id}<const VIEW: bool, const IN_PLACE: bool>;\n\
                     impl<const VIEW: bool, const IN_PLACE: bool> UnitFn for Rows{id}<VIEW, IN_PLACE> {{\n\
                     #[inline(always)]\n\
                     fn parse(buf: &[u8], s: &mut [Slot], cx: &mut Cx) -> usize {{ {name}::<VIEW, {{ tracks_rows({slots}) }}, IN_PLACE>(buf, s, cx) }}\n}}\n\n\
                     /// `{unit}`, message after message.\n\
                     fn batch_{id}<const VIEW: bool, const IN_PLACE: bool>(buf: &[u8], b: &mut Batch, cx: &mut Cx) -> usize {{\n\
                     batch::<{slots}, Rows{id}<VIEW, IN_PLACE>>(buf, b, cx)\n}}\n\n\
                     /// `{unit}`, a message from each buffer.\n\
                     fn each_{id}<const VIEW: bool, const IN_PLACE: bool>(m: &[&[u8]], b: &mut Batch, cx: &mut Cx) -> usize {{\n\
                     each::<{slots}, Rows{id}<VIEW, IN_PLACE>>(m, b, cx)\n}}\n\n",
                    unit = info.name,
                    slots = info.slots,
                    body = u.resolve_unsets(),
                );
                // Code that hands slots to the evaluator needs them stored.
                let in_place = u.in_place_ok && u.exprs.is_empty();
                // Each variant, `[view][in place]`, or what stands for one
                // the code cannot honour.
                let variants = |f: &dyn Fn(bool, bool) -> String, none: &str| {
                    let one = |v: bool, p: bool| {
                        if (v && !u.views) || (p && !in_place) {
                            none.to_string()
                        } else {
                            f(v, p)
                        }
                    };
                    let (a, b) = (one(false, false), one(false, true));
                    let (c, d) = (one(true, false), one(true, true));
                    format!("[[{a}, {b}], [{c}, {d}]]")
                };
                let one = variants(&|v, p| format!("{name}::<{v}, true, {p}>"), "no_view");
                let each = variants(&|v, p| format!("each_{id}::<{v}, {p}>"), "no_each");
                let batch = variants(&|v, p| format!("batch_{id}::<{v}, {p}>"), "no_batch");
                let _ = writeln!(
                    table,
                    "    CompiledUnit {{ unit: {:?}, one: {one}, batch: {batch}, each: {each} }},",
                    info.name
                );
                units.push(Some(GeneratedUnit {
                    exprs: u.exprs,
                    views: u.views,
                    in_place,
                }));
            }
            Err(Unsupported(why)) => {
                skipped.push((info.name.clone(), why));
                units.push(None)
            }
        }
    }
    let body = format!(
        "use flick_wire::rt::*;\n\n{fns}\
         #[allow(dead_code)]\nfn no_view(_: &[u8], _: &mut [Slot], cx: &mut Cx) -> usize {{ cx.high = 0; FALLBACK }}\n\n\
         #[allow(dead_code)]\nfn no_batch(_: &[u8], _: &mut Batch, _: &mut Cx) -> usize {{ 0 }}\n\n\
         #[allow(dead_code)]\nfn no_each(_: &[&[u8]], _: &mut Batch, _: &mut Cx) -> usize {{ 0 }}\n\n\
         pub static UNITS: &[CompiledUnit] = &[\n{table}];\n"
    );
    let mut h = Fnv::default();
    h.write(body.as_bytes());
    for u in units.iter().flatten() {
        h.write(format!("{:?}", u.exprs).as_bytes());
    }
    let fingerprint = h.0;
    let code = format!(
        "// Generated by flick_wire::codegen from grammar `{name}`; do not edit.\n\n{body}\n\
         pub static GRAMMAR: CompiledGrammar = CompiledGrammar {{ name: {name:?}, fingerprint: {fingerprint:#x}, units: UNITS }};\n\n{fields}",
        name = g.name,
        fields = field_consts(g),
    );
    Generated {
        code,
        fingerprint,
        units,
        skipped,
    }
}

/// FNV-1a, 64 bits: stable across builds, unlike the standard hasher.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// Why a unit gets no generated parser.
struct Unsupported(&'static str);

type Gen = Result<(), Unsupported>;

/// Where a unit instance's slots start: known when the code is generated,
/// or (list elements) a variable.
#[derive(Clone)]
enum Base {
    Static(usize),
    Dyn(String),
}

impl Base {
    fn at(&self, rel: u16) -> String {
        match self {
            Base::Static(b) => (b + rel as usize).to_string(),
            Base::Dyn(v) => format!("({v} + {rel})"),
        }
    }

    fn expr(&self) -> String {
        match self {
            Base::Static(b) => b.to_string(),
            Base::Dyn(v) => v.clone(),
        }
    }

    fn offset(&self, by: u16) -> Base {
        match self {
            Base::Static(b) => Base::Static(b + by as usize),
            Base::Dyn(v) => Base::Dyn(format!("({v} + {by})")),
        }
    }
}

/// A unit instance being generated: its base and the locals holding the
/// slots set so far on this path. A slot without a local is read from
/// the slot array (where it is unset if no path set it).
#[derive(Clone)]
struct Scope {
    base: Base,
    vals: HashMap<u16, String>,
    /// Slots set on every path so far without a local (after a switch or a
    /// unit inside the unit), by index expression.
    assigned: HashSet<String>,
}

const FB: &str = "{ cx.high = high; return FALLBACK }";

struct UnitGen<'g> {
    g: &'g Grammar,
    out: String,
    exprs: Vec<CExpr>,
    /// Slots every view keeps: stored unconditionally.
    min_view: std::sync::Arc<[bool]>,
    /// Slots of fields read in place, which `IN_PLACE` code leaves
    /// unstored.
    in_place: std::sync::Arc<[bool]>,
    /// No code reads a slot of `in_place` back from the slots.
    in_place_ok: bool,
    views: bool,
    next: usize,
    depth: usize,
    /// Lookups folded into a list's loop, visible in the code being
    /// generated: the list's count slot, the field and key, and the locals
    /// holding how many elements matched and the last one's base.
    fused: Vec<Fused>,
    /// Per switch arm being generated, the slots it sets.
    writes: Vec<HashSet<String>>,
    /// How many bits of `Cx::arms` the unit's switch arms have taken.
    arm_bits: u32,
    /// Per switch arm being generated, its own `Cx::arms` bit (0 for
    /// none) and the bits of the arms inside it.
    arm_stack: Vec<(u64, u64)>,
    /// Per slot, the bits of the arms that store it.
    setters: HashMap<String, u64>,
    /// Slots stored outside any arm with a bit: unset whenever an arm
    /// unsets them.
    unwitnessed: HashSet<String>,
    /// The slots each arm's conditional unsets cover, by their place
    /// holder in the code.
    unset_groups: Vec<Vec<String>>,
    /// The count slots of lists generated so far, with their elements'
    /// size in slots.
    list_elems: HashMap<String, usize>,
    /// Locals of type `Slot` known to hold an integer, with that integer
    /// as an `i128` expression.
    ints: HashMap<String, String>,
    /// One past the highest slot the code so far stores at a constant
    /// index, and whether a loop or a computed index came first
    /// ([`UnitGen::high_after`]).
    high_bound: usize,
    high_dynamic: bool,
    /// The blocks being generated, outermost first, each with the step
    /// being generated: the interpreter's frames there.
    path: Vec<(BlockId, usize)>,
    /// In the arms of a switch of the unit's own block: the local an arm
    /// whose last step is a non-empty stream sets to its block and step,
    /// and whether one did; the head is handed over after the switch.
    arm_head: Option<(String, bool)>,
}

/// A switch arm's code, with what it sets: its slots, and the
/// `Cx::arms` bits of its own (`bit`, if any) and of the arms inside it.
struct Arm {
    label: String,
    body: String,
    set: HashSet<String>,
    inside: u64,
    bit: u64,
    /// The slots it leaves in locals; `None` for an arm that falls back.
    vals: Option<HashMap<u16, String>>,
}

/// Where a switch arm's unsets are made conditional once the unit is
/// generated (`UnitGen::resolve_unsets`).
const ARMS_OPEN: &str = "@arms";
const ARMS_CLOSE: &str = "@";

struct Fused {
    list: usize,
    field: u16,
    key: std::sync::Arc<[u8]>,
    count: String,
    last: String,
}

/// A byte string literal.
fn lit(b: &[u8]) -> String {
    let mut s = String::from("b\"");
    for c in b {
        for e in std::ascii::escape_default(*c) {
            s.push(e as char);
        }
    }
    s.push('"');
    s
}

impl UnitGen<'_> {
    fn fresh(&mut self, stem: &str) -> String {
        self.next += 1;
        format!("{stem}{}", self.next)
    }

    fn line(&mut self, s: &str) {
        self.out.push_str(s);
        self.out.push('\n');
    }

    /// The slot `rel` of the scope, as a `Slot` expression.
    fn read(&mut self, sc: &Scope, rel: u16) -> String {
        if let Base::Static(b) = sc.base {
            if !self
                .min_view
                .get(b + rel as usize)
                .copied()
                .unwrap_or(false)
            {
                self.views = false;
            }
        }
        match sc.vals.get(&rel) {
            Some(v) => v.clone(),
            // A slot not set on this path may still hold the last
            // message's value; the interpreter would see it unset.
            None if !sc.assigned.contains(&sc.base.at(rel)) => "Slot::Unset".to_string(),
            None => {
                if self.is_in_place(sc, rel) {
                    self.in_place_ok = false;
                }
                format!("s[{}]", sc.base.at(rel))
            }
        }
    }

    /// Stores `val` in slot `rel`, as the interpreter would: a field a view
    /// may leave out only when the view keeps it.
    fn store(
        &mut self,
        sc: &mut Scope,
        rel: Option<u16>,
        val: &str,
        always: bool,
    ) -> Option<String> {
        let rel = rel?;
        let v = self.fresh("v");
        let idx = sc.base.at(rel);
        let guarded = match sc.base {
            Base::Static(b) => {
                !always
                    && !self
                        .min_view
                        .get(b + rel as usize)
                        .copied()
                        .unwrap_or(false)
            }
            Base::Dyn(_) => false,
        };
        self.line(&format!("let {v}: Slot = {val};"));
        let mut set = format!("s[{idx}] = {v}; {}", self.high_after(&idx));
        if self.is_in_place(sc, rel) {
            set = format!("if !IN_PLACE {{ {set} }}");
        }
        if guarded {
            let kept = match sc.base {
                Base::Static(b) if b + (rel as usize) < crate::rt::KEEP_BITS => {
                    let at = b + rel as usize;
                    format!("cx.keep_bits[{}] >> {} & 1 != 0", at / 64, at % 64)
                }
                _ => format!("cx.keep[{idx}]"),
            };
            self.line(&format!("if !VIEW || {kept} {{ {set} }}"));
        } else {
            self.line(&set);
        }
        self.stored(&idx);
        if let Some(top) = self.writes.last_mut() {
            top.insert(idx);
        }
        sc.vals.insert(rel, v.clone());
        Some(v)
    }

    /// Whether slot `rel` of the scope holds a field read in place.
    fn is_in_place(&self, sc: &Scope, rel: u16) -> bool {
        match sc.base {
            Base::Static(b) => self.in_place.get(b + rel as usize) == Some(&true),
            Base::Dyn(_) => false,
        }
    }

    /// Notes that the code being generated stores slot `idx`, and which
    /// arm's bit says it may be set.
    /// The code that keeps `high` past slot `idx`, just stored. Slots are
    /// numbered in the order the grammar writes its fields, so before any
    /// loop or slot computed at run time the highest slot stored on a path
    /// is the highest in the code so far: a constant, not a comparison.
    fn high_after(&mut self, idx: &str) -> String {
        match idx.parse::<usize>() {
            Ok(i) if !self.high_dynamic => {
                self.high_bound = self.high_bound.max(i + 1);
                format!("if TRACK {{ high = {}; }}", self.high_bound)
            }
            _ => {
                self.high_dynamic = true;
                format!("if TRACK && high < {idx} + 1 {{ high = {idx} + 1; }}")
            }
        }
    }

    fn stored(&mut self, idx: &str) {
        match self.arm_stack.last() {
            Some(&(bit, _)) if bit != 0 => *self.setters.entry(idx.to_string()).or_default() |= bit,
            _ => {
                self.unwitnessed.insert(idx.to_string());
            }
        }
    }

    /// The unit's code with each arm's unsets made conditional on the bits
    /// of the arms that may have stored what they unset.
    fn resolve_unsets(&self) -> String {
        let mut out = String::with_capacity(self.out.len());
        let mut rest = self.out.as_str();
        while let Some(at) = rest.find(ARMS_OPEN) {
            out.push_str(&rest[..at]);
            rest = &rest[at + ARMS_OPEN.len()..];
            let end = rest.find(ARMS_CLOSE).expect("a closed place holder");
            let group: usize = rest[..end].parse().expect("a group number");
            rest = &rest[end + ARMS_CLOSE.len()..];
            let slots = &self.unset_groups[group];
            let mask = slots.iter().try_fold(0u64, |m, idx| {
                match (self.unwitnessed.contains(idx), self.setters.get(idx)) {
                    (false, Some(bits)) => Some(m | bits),
                    _ => None,
                }
            });
            match mask {
                Some(m) if m != 0 => {
                    let _ = write!(out, "(!TRACK || cx.arms & {m:#x} != 0)");
                }
                _ => out.push_str("true"),
            }
        }
        out.push_str(rest);
        out
    }

    /// Stores an integer field's value, `raw` of type `i64` if `signed`
    /// or `u64`, keeping it as a number for the expressions that read it.
    fn store_int(&mut self, sc: &mut Scope, rel: Option<u16>, raw: &str, signed: bool) {
        let (i, ty) = (self.fresh("i"), if signed { "i64" } else { "u64" });
        self.line(&format!("let {i}: {ty} = {raw};"));
        let ctor = if signed { "SInt" } else { "Int" };
        if let Some(v) = self.store(sc, rel, &format!("Slot::{ctor}({i})"), false) {
            self.ints.insert(v, format!("({i} as i128)"));
        }
    }

    /// The integer a `Slot` expression holds, as `i128`; where it holds
    /// none (unset, bytes), the code falls back as the evaluator fails.
    fn int_of(&self, x: &str) -> String {
        match self.ints.get(x) {
            Some(i) => i.clone(),
            None => format!("(match int({x}) {{ Some(v) => v, None => {FB} }})"),
        }
    }

    fn block(&mut self, b: BlockId, sc: &mut Scope) -> Gen {
        self.depth += 1;
        if self.depth > 32 {
            return Err(Unsupported("units nested too deep"));
        }
        // Lookups folded into a list of this block are visible only in it.
        let fused = self.fused.len();
        let g = self.g;
        let steps = &g.plan.blocks[b as usize];
        self.path.push((b, 0));
        let mut i = 0;
        while i < steps.len() {
            if let Some(at) = self.path.last_mut() {
                at.1 = i;
            }
            if matches!(steps[i].kind, StepKind::Run(_)) {
                i += 1;
                continue;
            }
            let n = self.fixed_run(b, i);
            if n >= 2 {
                self.run(b, i, n, sc)?;
                i += n;
                continue;
            }
            self.step(b, i, sc)?;
            i += 1;
        }
        self.path.pop();
        self.fused.truncate(fused);
        self.depth -= 1;
        Ok(())
    }

    /// The width of step `i` of block `b` if it is fixed and it can join a
    /// run of such steps.
    fn width(&self, b: BlockId, i: usize) -> Option<usize> {
        let step = &self.g.plan.blocks[b as usize][i];
        let op = &self.g.blocks[b as usize][step.op as usize];
        if op.stream {
            return None;
        }
        match (&step.kind, &op.kind) {
            (StepKind::Int(f), _) => Some(f.width as usize),
            (
                StepKind::Bytes {
                    len: IntExpr::Const(n),
                    max,
                },
                _,
            ) if *n >= 0 && *n <= *max as i128 => Some(*n as usize),
            (StepKind::Scalar, OpKind::Scalar(Scalar::Literal { bytes, .. })) => Some(bytes.len()),
            (StepKind::Var(_) | StepKind::Nothing | StepKind::Mark, _) => Some(0),
            _ => None,
        }
    }

    /// How many steps from `i` make a run of fixed-width fields.
    fn fixed_run(&self, b: BlockId, i: usize) -> usize {
        let steps = &self.g.plan.blocks[b as usize];
        (i..steps.len())
            .take_while(|&k| {
                !matches!(steps[k].kind, StepKind::Run(_)) && self.width(b, k).is_some()
            })
            .count()
    }

    /// Steps `i..i + n`, all fixed-width: one bounds check for them all.
    fn run(&mut self, b: BlockId, i: usize, n: usize, sc: &mut Scope) -> Gen {
        let width: usize = (i..i + n).map(|k| self.width(b, k).unwrap_or(0)).sum();
        let r = self.fresh("r");
        if width > 0 {
            self.line(&format!(
                "let Some({r}) = buf.get(pos..pos + {width}) else {{ {FB} }};"
            ));
        }
        let mut off = 0;
        for k in i..i + n {
            let w = self.width(b, k).unwrap_or(0);
            let g = self.g;
            let step = &g.plan.blocks[b as usize][k];
            let op = &g.blocks[b as usize][step.op as usize];
            match (&step.kind, &op.kind) {
                (StepKind::Int(f), _) => {
                    let v = int_decode(&r, off, f.width, f.signed, f.little);
                    self.store_int(sc, step.slot, &v, f.signed);
                }
                (StepKind::Bytes { .. }, _) => {
                    let v = format!("Slot::Bytes {{ start: (pos + {off}) as u32, len: {w} }}");
                    self.store(sc, step.slot, &v, false);
                }
                (StepKind::Scalar, OpKind::Scalar(Scalar::Literal { bytes, nocase })) => {
                    let got = format!("{r}[{off}..{}]", off + w);
                    let cond = if *nocase {
                        format!("{got}.eq_ignore_ascii_case({})", lit(bytes))
                    } else {
                        format!("{got} == {}[..]", lit(bytes))
                    };
                    self.line(&format!("if !({cond}) {{ {FB} }}"));
                    let v = format!("Slot::Bytes {{ start: (pos + {off}) as u32, len: {w} }}");
                    self.store(sc, step.slot, &v, false);
                }
                (StepKind::Var(e), _) => self.var_step(b, step.op as usize, e, step.slot, sc)?,
                (StepKind::Mark, _) => self.mark(sc, step.slot, &format!("pos + {off}")),
                _ => {}
            }
            if let Some(c) = &step.check {
                self.check(&c.expr, sc, step.slot)?;
            }
            off += w;
        }
        if width > 0 {
            self.line(&format!("pos += {width};"));
        }
        Ok(())
    }

    /// Where the unit begins, `at`, stored whatever the view (every view
    /// keeps it).
    fn mark(&mut self, sc: &mut Scope, slot: Option<u16>, at: &str) {
        self.store(sc, slot, &format!("Slot::Int(({at}) as u64)"), true);
    }

    /// `&requires`: the check's expression, with `$$` the field's slot.
    fn check(&mut self, e: &IntExpr, sc: &mut Scope, slot: Option<u16>) -> Gen {
        let dollar = match slot {
            Some(rel) => (self.read(sc, rel), Some(sc.base.at(rel))),
            None => ("Slot::Unset".to_string(), None),
        };
        let v = self.int(e, sc, &dollar)?;
        self.line(&format!("if {v} == 0 {{ {FB} }}"));
        Ok(())
    }

    fn step(&mut self, b: BlockId, i: usize, sc: &mut Scope) -> Gen {
        let g = self.g;
        let step = &g.plan.blocks[b as usize][i];
        let op = &g.blocks[b as usize][step.op as usize];
        if op.stream {
            return self.stream(op, sc);
        }
        match (&step.kind, &op.kind) {
            (StepKind::Int(f), _) => {
                let r = self.fresh("r");
                let n = f.width;
                self.line(&format!(
                    "let Some({r}) = buf.get(pos..pos + {n}) else {{ {FB} }};"
                ));
                let v = int_decode(&r, 0, f.width, f.signed, f.little);
                self.store_int(sc, step.slot, &v, f.signed);
                self.line(&format!("pos += {n};"));
            }
            (StepKind::Bytes { len, max }, _) => {
                self.bytes_len(len, *max, sc, step.slot)?;
            }
            (StepKind::VInt, _) => self.scalar(&Scalar::VInt, op, sc, step.slot)?,
            // A token up to a delimiter that is no token character (an
            // HTTP method or header name): one scan checks both.
            (
                StepKind::Scalar,
                OpKind::Scalar(Scalar::Bytes {
                    len: Len::Until(d),
                    max,
                }),
            ) if d.len() == 1 && !crate::eval::is_tchar(d[0]) && is_token_check(step) => {
                let e = self.fresh("e");
                self.line(&format!(
                    "let Some({e}) = token_until(buf, pos, {}, {max}) else {{ {FB} }};",
                    d[0]
                ));
                let v = format!("Slot::Bytes {{ start: pos as u32, len: ({e} - pos) as u32 }}");
                self.store(sc, step.slot, &v, false);
                self.line(&format!("pos = {e} + 1;"));
                return Ok(());
            }
            (StepKind::Scalar, OpKind::Scalar(s)) => self.scalar(s, op, sc, step.slot)?,
            (StepKind::Var(e), _) => self.var_step(b, step.op as usize, e, step.slot, sc)?,
            (StepKind::Nothing, _) => {}
            (StepKind::Mark, _) => self.mark(sc, step.slot, "pos"),
            (StepKind::Switch(sw), _) => self.switch(sw, sc)?,
            (StepKind::Unit(inner), _) => {
                let mut isc = Scope {
                    base: sc.base.offset(op.slot.unwrap_or(0)),
                    vals: HashMap::new(),
                    assigned: HashSet::new(),
                };
                self.writes.push(HashSet::new());
                self.block(*inner, &mut isc)?;
                let set = self.writes.pop().unwrap_or_default();
                self.assigned(sc, set);
                // What the nested unit holds in locals on every path, this
                // unit's expressions read there too (`self.ip4.protocol`).
                let at = op.slot.unwrap_or(0);
                for (rel, v) in isc.vals {
                    sc.vals.insert(at + rel, v);
                }
            }
            (StepKind::List, OpKind::List { .. }) => self.list(op, sc, (b, step.op as usize))?,
            _ => return Err(Unsupported("an operation the code generator does not know")),
        }
        if let Some(c) = &step.check {
            self.check(&c.expr, sc, step.slot)?;
        }
        Ok(())
    }

    /// A streamed field: an empty body is no stream; anything else makes
    /// the message a head. The code hands a head over to the interpreter
    /// ([`HEAD`](crate::rt::HEAD)) where its frames there are simple: the
    /// field in the unit's own block, or last in an arm of a switch there
    /// (handed over after the switch, once the arm has unset the others'
    /// slots). Elsewhere, and for other streamed fields, it falls back.
    fn stream(&mut self, op: &crate::program::Op, sc: &mut Scope) -> Gen {
        let OpKind::Scalar(Scalar::Bytes {
            len: Len::Expr(e), ..
        }) = &op.kind
        else {
            self.line(&format!("{FB};"));
            return Ok(());
        };
        let n = self.int(&lower(e), sc, &unset())?;
        let top = matches!(sc.base, Base::Static(0))
            && self.arm_stack.is_empty()
            && self.writes.is_empty();
        let g = self.g;
        let last_in_arm = |&(b, i): &(BlockId, usize)| i + 1 == g.plan.blocks[b as usize].len();
        let give = "if !TRACK || IN_PLACE";
        match self.path.as_slice() {
            [(b, i)] if top => {
                let last = last_in_arm(&(*b, *i));
                self.line(&format!(
                    "if {n} != 0 {{ {give} {FB} cx.high = high; cx.head = Head {{ frames: [({b}, {i}), (0, 0)], depth: 1, pos, last: {last} }}; return HEAD; }}"
                ))
            }
            [_, (b, i)]
                if matches!(sc.base, Base::Static(0))
                    && self.arm_stack.len() == 1
                    && self.arm_head.is_some()
                    && last_in_arm(&(*b, *i)) =>
            {
                let Some((flag, used)) = &mut self.arm_head else {
                    unreachable!("checked above")
                };
                *used = true;
                let flag = flag.clone();
                self.line(&format!(
                    "if {n} != 0 {{ {give} {FB} {flag} = ({b}, {i}); }}"
                ));
            }
            _ => self.line(&format!("if {n} != 0 {{ {FB} }}")),
        }
        Ok(())
    }

    /// Bytes of a computed length.
    fn bytes_len(&mut self, len: &IntExpr, max: u32, sc: &mut Scope, slot: Option<u16>) -> Gen {
        let n = self.fresh("n");
        let e = self.int(len, sc, &unset())?;
        self.line(&format!(
            // Compared as a `usize` once bounded: a 128-bit comparison
            // costs several instructions a field.
            "let {n} = {e}; if {n} < 0 || {n} > {max} {{ {FB} }} let {n} = {n} as usize; if buf.len() - pos < {n} {{ {FB} }}"
        ));
        let v = format!("Slot::Bytes {{ start: pos as u32, len: {n} as u32 }}");
        self.store(sc, slot, &v, false);
        self.line(&format!("pos += {n};"));
        Ok(())
    }

    fn scalar(
        &mut self,
        s: &Scalar,
        op: &crate::program::Op,
        sc: &mut Scope,
        slot: Option<u16>,
    ) -> Gen {
        let forbid = op.forbid.as_deref().unwrap_or(&[]);
        let bytes_at = |start: &str, len: &str| {
            format!("Slot::Bytes {{ start: {start} as u32, len: ({len}) as u32 }}")
        };
        match s {
            Scalar::Int {
                bytes,
                signed,
                order,
            } => {
                let r = self.fresh("r");
                self.line(&format!(
                    "let Some({r}) = buf.get(pos..pos + {bytes}) else {{ {FB} }};"
                ));
                let little = *order == crate::grammar::ast::ByteOrder::Little;
                let v = int_decode(&r, 0, *bytes, *signed, little);
                self.store_int(sc, slot, &v, *signed);
                self.line(&format!("pos += {bytes};"));
            }
            Scalar::Bytes {
                len: Len::Expr(e),
                max,
            } => self.bytes_len(&lower(e), *max, sc, slot)?,
            Scalar::Bytes { len: Len::Eof, .. } => self.line(&format!("{FB};")),
            Scalar::Bytes {
                len: Len::Until(d),
                max,
            } => {
                let e = self.fresh("e");
                self.line(&format!(
                    "let Some({e}) = until(buf, pos, {}, {max}, {}) else {{ {FB} }};",
                    lit(d),
                    lit(forbid)
                ));
                self.store(sc, slot, &bytes_at("pos", &format!("{e} - pos")), false);
                self.line(&format!("pos = {e} + {};", d.len()));
            }
            Scalar::Bytes {
                len: Len::BeforeAny(set, also),
                max,
            } => {
                let e = self.fresh("e");
                let find = if also.is_empty() {
                    format!("before_any(buf, pos, {}, {max})", lit(set))
                } else {
                    format!(
                        "before_any_or(buf, pos, {}, {}, {max})",
                        lit(set),
                        lit(also)
                    )
                };
                self.line(&format!(
                    "let Some({e}) = {find} else {{ {FB} }}; if {e} == pos {{ {FB} }}"
                ));
                self.store(sc, slot, &bytes_at("pos", &format!("{e} - pos")), false);
                self.line(&format!("pos = {e};"));
            }
            Scalar::Bytes {
                len: Len::WhileAny(set),
                max,
            } => {
                let e = self.fresh("e");
                self.line(&format!(
                    "let Some({e}) = while_any(buf, pos, {}, {max}) else {{ {FB} }};",
                    lit(set)
                ));
                self.store(sc, slot, &bytes_at("pos", &format!("{e} - pos")), false);
                self.line(&format!("pos = {e};"));
            }
            Scalar::AsciiInt {
                until: u,
                hex,
                before,
                signed,
                bytes,
            } => {
                let digits = 20 + usize::from(*signed);
                let e = self.fresh("e");
                let find = if *before {
                    format!("before_any(buf, pos, {}, {digits})", lit(u))
                } else {
                    format!("until(buf, pos, {}, {digits}, {})", lit(u), lit(forbid))
                };
                let a = self.fresh("a");
                self.line(&format!(
                    "let Some({e}) = {find} else {{ {FB} }}; let Some({a}) = ascii_int(&buf[pos..{e}], {hex}, {signed}, {bytes}) else {{ {FB} }};"
                ));
                self.store(sc, slot, &a, false);
                let skip = if *before { 0 } else { u.len() };
                self.line(&format!("pos = {e} + {skip};"));
            }
            Scalar::VInt => {
                let (v, n) = (self.fresh("x"), self.fresh("n"));
                self.line(&format!(
                    "let Some(({v}, {n})) = vlong_at(buf, pos) else {{ {FB} }};"
                ));
                self.store_int(sc, slot, &v, true);
                self.line(&format!("pos += {n};"));
            }
            Scalar::Literal { bytes, nocase } => {
                self.line(&format!(
                    "if !literal(buf, pos, {}, {nocase}) {{ {FB} }}",
                    lit(bytes)
                ));
                self.store(sc, slot, &bytes_at("pos", &bytes.len().to_string()), false);
                self.line(&format!("pos += {};", bytes.len()));
            }
            Scalar::Ws => {
                let n = self.fresh("n");
                self.line(&format!("let Some({n}) = ws(buf, pos) else {{ {FB} }};"));
                self.store(sc, slot, &bytes_at("pos", &n), false);
                self.line(&format!("pos += {n};"));
            }
        }
        Ok(())
    }

    /// A variable, stored as the interpreter does: always, but for bit
    /// fields a view may leave out (`Grammar::droppable_var`), which a
    /// view that keeps them keeps their source for.
    fn var_step(
        &mut self,
        b: BlockId,
        op: usize,
        e: &ValExpr,
        slot: Option<u16>,
        sc: &mut Scope,
    ) -> Gen {
        let droppable = self.g.droppable_var(b, op);
        let views = self.views;
        // An integer expression is kept as a number too, so that what
        // reads the variable (`$$` in its `&requires`, later fields)
        // compares numbers instead of calling the evaluator: as the slot
        // holds it (`slot_of` wraps to 64 bits), so both agree.
        let (v, computed) = match e {
            ValExpr::Int(i) => {
                let n = self.int(i, sc, &unset())?;
                let j = self.fresh("j");
                self.line(&format!("let {j}: i128 = slot_int({n});"));
                (format!("slot_of({j})"), Some(j))
            }
            _ => (self.var(e, sc)?, None),
        };
        if droppable {
            // Its source is read from a local whatever the view keeps.
            self.views = views;
        }
        // A copy of an integer is that integer, for what reads the copy.
        let copied = match e {
            ValExpr::Slot(from) => {
                let x = self.read(sc, *from);
                self.ints.get(&x).cloned()
            }
            _ => computed,
        };
        if let (Some(local), Some(i)) = (self.store(sc, slot, &v, !droppable), copied) {
            self.ints.insert(local, i);
        }
        Ok(())
    }

    /// A variable's value, as a `Slot` expression.
    fn var(&mut self, e: &ValExpr, sc: &mut Scope) -> Result<String, Unsupported> {
        Ok(match e {
            // As the interpreter: through the value, so an integer's slot
            // says its sign, not its field's type.
            ValExpr::Slot(s) => {
                let x = self.read(sc, *s);
                if let Some(i) = self.ints.get(&x) {
                    return Ok(format!("slot_of({i})"));
                }
                format!("match {x} {{ Slot::Bytes {{ .. }} | Slot::Unset => {x}, other => slot_of(int(other).unwrap_or(0)) }}")
            }
            ValExpr::Bits {
                slot,
                shift,
                mask,
                expr,
            } => {
                let x = self.read(sc, *slot);
                let i = self.int(expr, sc, &unset())?;
                format!("match {x} {{ Slot::Int(v) => Slot::Int((v >> {shift}) & {mask}), _ => slot_of({i}) }}")
            }
            ValExpr::Int(i) => format!("slot_of({})", self.int(i, sc, &unset())?),
            ValExpr::General(c) => match self.val(c, sc, &unset()) {
                Ok(v) => format!("var_slot({v}, buf)"),
                Err(_) => {
                    let k = self.general(c);
                    format!(
                        "match general_slot(cx, {k}, s, {}, buf) {{ Some(v) => v, None => {FB} }}",
                        sc.base.expr()
                    )
                }
            },
        })
    }

    fn general(&mut self, c: &CExpr) -> usize {
        self.exprs.push(c.clone());
        self.exprs.len() - 1
    }

    fn switch(&mut self, sw: &crate::plan::Switch, sc: &mut Scope) -> Gen {
        let Cases::Consts(cases) = &sw.cases else {
            return Err(Unsupported("a switch over computed cases"));
        };
        // Which case: its position plus one, 0 for none. The first equal
        // case wins, as in the interpreter.
        let mut ints = String::new();
        let mut strs = String::new();
        let (mut seen_i, mut seen_s) = (Vec::new(), Vec::new());
        for (k, (c, _)) in cases.iter().enumerate() {
            match c {
                Case::Int(v) if !seen_i.contains(v) => {
                    seen_i.push(*v);
                    let _ = write!(ints, "{v} => {}, ", k + 1);
                }
                Case::Bytes(b, _) if !seen_s.contains(b) => {
                    seen_s.push(b.clone());
                    let _ = write!(strs, "{} => {}, ", lit(b), k + 1);
                }
                _ => {}
            }
        }
        let on_int = |v: &str| format!("match {v} {{ {ints}_ => 0 }}");
        let on_bytes = |v: &str| format!("match {v} {{ {strs}_ => 0usize }}");
        let which = self.fresh("k");
        let pick = match &sw.on {
            ValExpr::Slot(s) => {
                let x = self.read(sc, *s);
                match self.ints.get(&x) {
                    Some(i) => format!("{{ let v: i128 = {i}; {} }}", on_int("v")),
                    None => format!(
                    "match value(buf, {x}) {{ Some(Err(v)) => {}, Some(Ok(b)) => {}, None => 0 }}",
                    on_int("v"),
                    on_bytes("b")
                ),
                }
            }
            ValExpr::Int(i) | ValExpr::Bits { expr: i, .. } => {
                let v = self.int(i, sc, &unset())?;
                format!("{{ let v: i128 = {v}; {} }}", on_int("v"))
            }
            ValExpr::General(c) => match self.val(c, sc, &unset()) {
                Ok(v) => format!(
                    "match {v} {{ Val::Int(v) => {}, Val::Bytes(b) => {}, _ => 0 }}",
                    on_int("v"),
                    on_bytes("b")
                ),
                Err(_) => {
                    let k = self.general(c);
                    format!(
                        "match general_val(cx, {k}, s, {}, buf) {{ Some(Err(v)) => {}, Some(Ok(b)) => {}, None => 0 }}",
                        sc.base.expr(),
                        on_int("v"),
                        on_bytes("b")
                    )
                }
            },
        };
        self.line(&format!("let {which}: usize = {pick};"));
        // Each arm is generated apart, to learn which slots it sets; each
        // arm then unsets the slots only other arms set.
        let mut arms: Vec<Arm> = Vec::new();
        // An arm that may store slots gets a bit of `Cx::arms`, set once it
        // has: other code unsets those slots only while it is set. Not
        // inside a list element, whose arms differ from element to element.
        let witnessed = matches!(sc.base, Base::Static(_));
        let mut done: Vec<BlockId> = Vec::new();
        // A switch of the unit's own block: an arm may end in a head.
        let outer = std::mem::take(&mut self.arm_head);
        let at_top = matches!(sc.base, Base::Static(0))
            && self.arm_stack.is_empty()
            && self.writes.is_empty()
            && self.path.len() == 1;
        if at_top {
            self.arm_head = Some((self.fresh("hd"), false));
        }
        let blocks = cases
            .iter()
            .map(|(_, b)| Some(*b))
            .chain([sw.default.or(None)])
            .collect::<Vec<_>>();
        for (k, b) in blocks.iter().enumerate() {
            let label = if k == cases.len() {
                "_".to_string()
            } else {
                let b = b.expect("cases have blocks");
                if done.contains(&b) {
                    continue;
                }
                done.push(b);
                (0..cases.len())
                    .filter(|&j| cases[j].1 == b)
                    .map(|j| (j + 1).to_string())
                    .collect::<Vec<_>>()
                    .join(" | ")
            };
            let bit = if witnessed && b.is_some() && self.arm_bits < u64::BITS {
                self.arm_bits += 1;
                1 << (self.arm_bits - 1)
            } else {
                0
            };
            let saved = std::mem::take(&mut self.out);
            self.writes.push(HashSet::new());
            self.arm_stack.push((bit, 0));
            let vals = match b {
                Some(b) => {
                    let mut inner = sc.clone();
                    self.block(*b, &mut inner)?;
                    Some(inner.vals)
                }
                None => {
                    self.line(&format!("{FB};"));
                    None
                }
            };
            let (_, inside) = self.arm_stack.pop().unwrap_or_default();
            let set = self.writes.pop().unwrap_or_default();
            let body = std::mem::replace(&mut self.out, saved);
            arms.push(Arm {
                label,
                body,
                set,
                inside,
                bit,
                vals,
            });
        }
        let union: HashSet<String> = arms.iter().flat_map(|a| a.set.iter().cloned()).collect();
        // A slot this message already wrote on every path before the switch
        // (a field of the same name set by an earlier switch) holds what the
        // interpreter holds: an arm that does not set it leaves it so.
        let before: HashSet<String> = sc
            .assigned
            .iter()
            .cloned()
            .chain(sc.vals.keys().map(|rel| sc.base.at(*rel)))
            .collect();
        if let Some(top) = self.arm_stack.last_mut() {
            top.1 |= arms.iter().fold(0, |m, a| m | a.bit | a.inside);
        }
        // An integer every arm leaves in a local is one local after the
        // switch, for the expressions that read it (`self.eth.payload_type`).
        let mut merged = Vec::new();
        if let Some(first) = arms.iter().find_map(|a| a.vals.as_ref()) {
            let mut rels: Vec<u16> = first.keys().copied().collect();
            rels.sort();
            for rel in rels {
                let ints: Option<Vec<String>> = arms
                    .iter()
                    .filter_map(|a| a.vals.as_ref())
                    .map(|vals| vals.get(&rel).and_then(|v| self.ints.get(v)).cloned())
                    .collect();
                // One the switch leaves as it was needs no merging.
                let kept = arms
                    .iter()
                    .filter_map(|a| a.vals.as_ref())
                    .all(|vals| vals.get(&rel) == sc.vals.get(&rel));
                if ints.is_some() && !kept {
                    merged.push((rel, self.fresh("j"), self.fresh("v")));
                }
            }
        }
        for (_, j, v) in &merged {
            self.line(&format!("let {j}: i128; let {v}: Slot;"));
        }
        let head = match std::mem::replace(&mut self.arm_head, outer) {
            Some((flag, true)) => Some(flag),
            _ => None,
        };
        if let Some(flag) = &head {
            // No block has the largest id: it stands for no head.
            self.line(&format!("let mut {flag}: (u32, u32) = (u32::MAX, 0);"));
        }
        self.line(&format!("match {which} {{"));
        for (k, a) in arms.iter().enumerate() {
            self.line(&format!("{} => {{", a.label));
            self.out.push_str(&a.body);
            if let Some(vals) = &a.vals {
                for (rel, j, v) in &merged {
                    let local = &vals[rel];
                    self.line(&format!("{j} = {}; {v} = {local};", self.ints[local]));
                }
            }
            let mut rest: Vec<String> = union
                .difference(&a.set)
                .filter(|idx| !before.contains(*idx))
                .cloned()
                .collect();
            rest.sort();
            // Which arms may have stored these is known once the whole unit
            // is generated.
            let guarded = witnessed && !rest.is_empty();
            if guarded {
                let group = self.unset_groups.len();
                self.line(&format!("if {ARMS_OPEN}{group}{ARMS_CLOSE} {{"));
            }
            for idx in &rest {
                match self.list_elems.get(idx) {
                    Some(e) => self.line(&format!("unset_list(s, {idx}, {e});")),
                    None => self.line(&format!("s[{idx}] = Slot::Unset;")),
                }
            }
            if guarded {
                self.line("}");
                self.unset_groups.push(rest);
            }
            // The other arms' slots are unset now, or this arm's own.
            let others = arms
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != k)
                .fold(0, |m, (_, o)| m | o.bit | o.inside);
            if witnessed && (others != 0 || a.bit != 0) {
                self.line(&format!(
                    "if TRACK {{ cx.arms = cx.arms & !{others:#x} | {:#x}; }}",
                    a.bit
                ));
            }
            self.line("}");
        }
        self.line("}");
        if let (Some(flag), Some(&(b, i))) = (&head, self.path.last()) {
            // The arm's field is its last step; the switch may be followed.
            let last = i + 1 == self.g.plan.blocks[b as usize].len();
            self.line(&format!(
                "if {flag}.0 != u32::MAX {{ cx.high = high; cx.head = Head {{ frames: [({b}, {}), {flag}], depth: 2, pos, last: {last} }}; return HEAD; }}",
                i + 1
            ));
        }
        self.assigned(sc, union);
        for (rel, j, v) in merged {
            self.ints.insert(v.clone(), j);
            sc.vals.insert(rel, v);
        }
        Ok(())
    }

    /// Notes slots set (or unset) on every path so far: reads see them in
    /// the slot array, and the enclosing arm counts them as its own.
    fn assigned(&mut self, sc: &mut Scope, slots: HashSet<String>) {
        if let Some(top) = self.writes.last_mut() {
            top.extend(slots.iter().cloned());
        }
        sc.assigned.extend(slots);
    }

    /// A list; `at` is its block and operation, whose later operations'
    /// lookups in it are folded into its loop.
    fn list(&mut self, op: &crate::program::Op, sc: &mut Scope, at: (BlockId, usize)) -> Gen {
        let OpKind::List {
            elem,
            stop,
            sep,
            max,
            max_bytes,
        } = &op.kind
        else {
            return Err(Unsupported("a list operation without a list"));
        };
        let lb = self.fresh("lb");
        let (start, li) = (self.fresh("ls"), self.fresh("li"));
        let count = sc.base.at(op.slot.unwrap_or(0));
        let elem_slots = match elem {
            Elem::Unit { slots, .. } => *slots as usize,
            Elem::Scalar(_) => 1,
        };
        // The elements the last message left past this one's count are
        // unset once the list ends, so that no slot outlives its message.
        let old = self.fresh("lo");
        let high = self.high_after(&count);
        self.line(&format!(
            "let {lb} = {count}; let {old} = list_len(s[{lb}]); s[{lb}] = Slot::Count(0); {high} let {start} = pos; let mut {li}: u32 = 0;"
        ));
        // A loop's body may run again after stores written below it.
        self.high_dynamic = true;
        // An arm sets the count, and unsets the list through it; what the
        // elements set is the list's own.
        self.stored(&count);
        if let Some(top) = self.writes.last_mut() {
            top.insert(count.clone());
        }
        self.list_elems.insert(count, elem_slots);
        self.writes.push(HashSet::new());
        let target = self.fresh("t");
        if let Stop::Count(e) = stop {
            let n = self.int(&lower(e), sc, &unset())?;
            self.line(&format!(
                "let {target} = {n}; if {target} < 0 || {target} > {max} {{ {FB} }} let {target} = {target} as u32;"
            ));
        }
        let mut folded = Vec::new();
        if let (Base::Static(b), Some(slot), Elem::Unit { .. }) = (&sc.base, op.slot, elem) {
            let mut keys = Vec::new();
            for later in &self.g.blocks[at.0 as usize][at.1 + 1..] {
                lookups_of(self.g, later, slot, &mut keys, 0);
            }
            for (field, key) in keys {
                let (count, last) = (self.fresh("mc"), self.fresh("ml"));
                self.line(&format!(
                    "let mut {count}: u32 = 0; let mut {last}: Option<usize> = None;"
                ));
                folded.push(Fused {
                    list: b + slot as usize,
                    field,
                    key,
                    count,
                    last,
                });
            }
        }
        self.line("loop {");
        if let Some(mb) = max_bytes {
            self.line(&format!("if pos - {start} > {mb} {{ {FB} }}"));
        }
        match stop {
            Stop::Count(_) => self.line(&format!("if {li} == {target} {{ break; }}")),
            Stop::Until(t) => self.line(&format!(
                "if buf.len() - pos < {n} {{ {FB} }} if buf[pos..pos + {n}] == {l}[..] {{ pos += {n}; break; }}",
                n = t.len(),
                l = lit(t)
            )),
            // The first terminator where both match; where the bytes so far
            // may still be the first, the interpreter waits for more.
            Stop::UntilEither(t, also) => {
                self.line(&format!(
                    "if buf.len() - pos >= {n} && buf[pos..pos + {n}] == {l}[..] {{ pos += {n}; break; }}",
                    n = t.len(),
                    l = lit(t)
                ));
                self.line(&format!(
                    "if buf.len() - pos < {n} && {l}.starts_with(&buf[pos..]) {{ {FB} }}",
                    n = t.len(),
                    l = lit(t)
                ));
                self.line(&format!(
                    "if buf.len() - pos < {n} {{ {FB} }} if buf[pos..pos + {n}] == {l}[..] {{ pos += {n}; break; }}",
                    n = also.len(),
                    l = lit(also)
                ));
            }
            Stop::UntilElem(_) => self.line(&format!("{FB};")),
        }
        self.line(&format!("if {li} >= {max} {{ {FB} }}"));
        match elem {
            Elem::Unit { block, slots } => {
                if let Some(sp) = sep {
                    self.line(&format!(
                        "if {li} > 0 {{ if !literal(buf, pos, {}, false) {{ {FB} }} pos += {}; }}",
                        lit(sp),
                        sp.len()
                    ));
                }
                let eb = self.fresh("eb");
                self.line(&format!(
                    "s[{lb}] = Slot::Count({li} + 1); let {eb} = {lb} + 1 + {li} as usize * {slots};"
                ));
                let mut esc = Scope {
                    base: Base::Dyn(eb),
                    vals: HashMap::new(),
                    assigned: HashSet::new(),
                };
                self.line("{");
                self.block(*block, &mut esc)?;
                self.line("}");
                for f in &folded {
                    self.line(&format!(
                        "if let Slot::Bytes {{ start, len }} = s[{eb} + {field}] {{ if buf.get(start as usize..start as usize + len as usize).unwrap_or(&[]).eq_ignore_ascii_case({key}) {{ {count} += 1; {last} = Some({eb}); }} }}",
                        eb = match &esc.base { Base::Dyn(v) => v.clone(), Base::Static(v) => v.to_string() },
                        field = f.field,
                        key = lit(&f.key),
                        count = f.count,
                        last = f.last,
                    ));
                }
                self.line(&format!("{li} += 1;"));
            }
            Elem::Scalar(s) => {
                let at = self.fresh("at");
                self.line(&format!("let {at} = {lb} + 1 + {li} as usize;"));
                // The element's slot, relative to a base of its own.
                let mut esc = Scope {
                    base: Base::Dyn(at),
                    vals: HashMap::new(),
                    assigned: HashSet::new(),
                };
                match (&**s, sep, stop) {
                    (
                        Scalar::Bytes {
                            len: Len::Until(_),
                            max: m,
                        },
                        Some(sp),
                        Stop::Until(t),
                    ) => {
                        let (e, c) = (self.fresh("e"), self.fresh("c"));
                        self.line(&format!(
                            "let Some(({e}, {c})) = token(buf, pos, {}, {}, {m}) else {{ {FB} }};",
                            lit(sp),
                            lit(t)
                        ));
                        let v = format!("Slot::Bytes {{ start: pos as u32, len: {e} as u32 }}");
                        self.store(&mut esc, Some(0), &v, true);
                        self.line(&format!("pos += {e} + {c};"));
                    }
                    // Lengths of scalar elements are over the list's unit.
                    (
                        Scalar::Bytes {
                            len: Len::Expr(_), ..
                        },
                        ..,
                    ) => return Err(Unsupported("scalar list elements of a computed length")),
                    (s, ..) => self.scalar(s, op, &mut esc, Some(0))?,
                }
                self.line(&format!("s[{lb}] = Slot::Count({li} + 1); {li} += 1;"));
            }
        }
        self.line("}");
        self.line(&format!("unset_elems(s, {lb}, {li}, {old}, {elem_slots});"));
        self.writes.pop();
        self.fused.extend(folded);
        Ok(())
    }

    /// An integer expression as Rust of type `i128`; where the interpreter
    /// fails, the code falls back. `dollar` is `$$`: a `Slot` expression
    /// and the index of its slot, if it has one.
    fn int(
        &mut self,
        e: &IntExpr,
        sc: &mut Scope,
        dollar: &(String, Option<String>),
    ) -> Result<String, Unsupported> {
        Ok(match e {
            IntExpr::Const(v) => format!("({v}i128)"),
            IntExpr::Slot(s) => {
                let x = self.read(sc, *s);
                self.int_of(&x)
            }
            IntExpr::Dollar => self.int_of(&dollar.0),
            IntExpr::SlotChain(s, ops) => {
                let x = self.read(sc, *s);
                chain(&self.int_of(&x), ops)
            }
            IntExpr::Sum(sum) => {
                let mut v = format!("({}i128", sum.konst);
                for (x, neg) in sum.terms.iter() {
                    let x = self.operand(*x, sc, dollar);
                    let t = self.int_of(&x);
                    let _ = write!(v, " {} {t}", if *neg { '-' } else { '+' });
                }
                v.push(')');
                v
            }
            IntExpr::Node(n) => self.node(n, sc, dollar)?,
        })
    }

    /// An expression as the evaluator's `eval` computes it, as Rust of
    /// type `Val`; where the evaluator fails, the code falls back.
    fn val(
        &mut self,
        e: &CExpr,
        sc: &mut Scope,
        dollar: &(String, Option<String>),
    ) -> Result<String, Unsupported> {
        Ok(match e {
            CExpr::Int(v) => format!("Val::Int({v}i128)"),
            CExpr::Str(b) => format!("Val::Bytes(&{}[..])", lit(b)),
            CExpr::Slot(x) => {
                let x = self.read(sc, *x);
                match self.ints.get(&x) {
                    Some(i) => format!("Val::Int({i})"),
                    None => format!("val_of(buf, {x})"),
                }
            }
            CExpr::List(l) => format!("list_at(s, {}, {})", sc.base.at(l.slot), l.elem_slots),
            CExpr::Dollar => match self.ints.get(&dollar.0) {
                Some(i) => format!("Val::Int({i})"),
                None => format!("val_of(buf, {})", dollar.0),
            },
            CExpr::DollarField(_) | CExpr::ElemField(_) => {
                return Err(Unsupported("`$$.field` outside a list"))
            }
            CExpr::Unary(..) | CExpr::Binary(..) => {
                format!("Val::Int({})", self.int_c(e, sc, dollar)?)
            }
            CExpr::Call(f, args) => self.call(*f, args, sc, dollar)?,
        })
    }

    /// An expression as the evaluator's `int` computes it, as `i128`.
    fn int_c(
        &mut self,
        e: &CExpr,
        sc: &mut Scope,
        dollar: &(String, Option<String>),
    ) -> Result<String, Unsupported> {
        let checked = |x: String| format!("(match {x} {{ Some(v) => v, None => {FB} }})");
        Ok(match e {
            CExpr::Int(v) => format!("({v}i128)"),
            CExpr::Slot(x) => {
                let x = self.read(sc, *x);
                self.int_of(&x)
            }
            CExpr::Dollar => self.int_of(&dollar.0),
            CExpr::Unary(crate::grammar::ast::UnOp::Not, x) => {
                format!("(({} == 0) as i128)", self.int_c(x, sc, dollar)?)
            }
            CExpr::Unary(crate::grammar::ast::UnOp::Neg, x) => {
                format!("({}).wrapping_neg()", self.int_c(x, sc, dollar)?)
            }
            CExpr::Binary(op, a, b) => {
                use crate::grammar::ast::BinOp;
                match op {
                    BinOp::And | BinOp::Or => {
                        let (x, y) = (self.int_c(a, sc, dollar)?, self.int_c(b, sc, dollar)?);
                        if *op == BinOp::And {
                            format!("(if {x} != 0 {{ ({y} != 0) as i128 }} else {{ 0 }})")
                        } else {
                            format!("(if {x} != 0 {{ 1 }} else {{ ({y} != 0) as i128 }})")
                        }
                    }
                    BinOp::Eq | BinOp::Ne => {
                        let (x, y) = (self.val(a, sc, dollar)?, self.val(b, sc, dollar)?);
                        let cmp = if *op == BinOp::Eq { "==" } else { "!=" };
                        // Two numbers compare as `equal` compares them,
                        // without its call: one `cmp`.
                        match (int_val(&x), int_val(&y)) {
                            (Some(x), Some(y)) => format!("(({x} {cmp} {y}) as i128)"),
                            _ => {
                                let eq = *op == BinOp::Eq;
                                format!(
                                    "(match equal({x}, {y}) {{ Some(e) => (e == {eq}) as i128, None => {FB} }})"
                                )
                            }
                        }
                    }
                    _ => {
                        let (x, y) = (self.int_c(a, sc, dollar)?, self.int_c(b, sc, dollar)?);
                        match op {
                            BinOp::Add => checked(format!("{x}.checked_add({y})")),
                            BinOp::Sub => checked(format!("{x}.checked_sub({y})")),
                            BinOp::Mul => checked(format!("{x}.checked_mul({y})")),
                            BinOp::Div => checked(format!("{x}.checked_div({y})")),
                            BinOp::Mod => checked(format!("{x}.checked_rem({y})")),
                            BinOp::Lt => format!("(({x} < {y}) as i128)"),
                            BinOp::Le => format!("(({x} <= {y}) as i128)"),
                            BinOp::Gt => format!("(({x} > {y}) as i128)"),
                            _ => format!("(({x} >= {y}) as i128)"),
                        }
                    }
                }
            }
            _ => format!(
                "(match {} {{ Val::Int(v) => v, Val::List {{ count, .. }} => count as i128, _ => {FB} }})",
                self.val(e, sc, dollar)?
            ),
        })
    }

    /// An expression as the evaluator's `bytes` reads it: unset is empty.
    fn bytes_c(
        &mut self,
        e: &CExpr,
        sc: &mut Scope,
        dollar: &(String, Option<String>),
    ) -> Result<String, Unsupported> {
        Ok(format!(
            "(match {} {{ Val::Bytes(b) => b, Val::Unset => &[][..], _ => {FB} }})",
            self.val(e, sc, dollar)?
        ))
    }

    /// A builtin call, as `Val`.
    fn call(
        &mut self,
        f: Builtin,
        args: &[CExpr],
        sc: &mut Scope,
        dollar: &(String, Option<String>),
    ) -> Result<String, Unsupported> {
        let no = || Unsupported("a builtin the code generator does not know");
        let arg = |i: usize| {
            args.get(i)
                .ok_or(Unsupported("a builtin call short of arguments"))
        };
        let elem_field = |i: usize| match args.get(i) {
            Some(CExpr::ElemField(f)) => Ok(*f),
            _ => Err(Unsupported("a builtin call without a field name")),
        };
        let int = |b: String| format!("Val::Int(({b}) as i128)");
        let opt = |x: String| format!("(match {x} {{ Some(v) => v, None => {FB} }})");
        Ok(match f {
            Builtin::ReplyContext => "Val::Int(cx.context)".to_string(),
            Builtin::Limit => match args {
                [CExpr::Int(i), CExpr::Int(d)] => {
                    format!("Val::Int(cx.limits.get({i}).copied().unwrap_or({d}))")
                }
                _ => return Err(no()),
            },
            // Generated code finishes only messages with no stream begun.
            Builtin::Streamed => "Val::Int(0)".to_string(),
            Builtin::Choose => {
                let c = self.int_c(arg(0)?, sc, dollar)?;
                let (a, b) = (self.val(arg(1)?, sc, dollar)?, self.val(arg(2)?, sc, dollar)?);
                format!("(if {c} != 0 {{ {a} }} else {{ {b} }})")
            }
            Builtin::Len => format!(
                "(match {} {{ Val::Bytes(b) => Val::Int(b.len() as i128), Val::List {{ count, .. }} => Val::Int(count as i128), _ => {FB} }})",
                self.val(arg(0)?, sc, dollar)?
            ),
            Builtin::ToInt => format!("Val::Int({})", opt(format!("to_int({})", self.bytes_c(arg(0)?, sc, dollar)?))),
            Builtin::HexToInt => format!(
                "Val::Int({})",
                opt(format!("number({}, 16)", self.bytes_c(arg(0)?, sc, dollar)?))
            ),
            Builtin::IsDec | Builtin::IsHex => {
                let radix = if f == Builtin::IsDec { 10 } else { 16 };
                int(format!("number({}, {radix}).is_some()", self.bytes_c(arg(0)?, sc, dollar)?))
            }
            Builtin::EqNocase => {
                let (a, b) = (self.bytes_c(arg(0)?, sc, dollar)?, self.bytes_c(arg(1)?, sc, dollar)?);
                int(format!("{a}.eq_ignore_ascii_case({b})"))
            }
            Builtin::LastTokenNocase | Builtin::HasTokenNocase => {
                let name = if f == Builtin::LastTokenNocase {
                    "last_token_nocase"
                } else {
                    "has_token_nocase"
                };
                let (a, b) = (self.bytes_c(arg(0)?, sc, dollar)?, self.bytes_c(arg(1)?, sc, dollar)?);
                int(format!("{name}({a}, {b})"))
            }
            Builtin::EndsWithWs | Builtin::StartsWithWs | Builtin::IsToken => int(opt(format!(
                "bytes_test(Builtin::{f:?}, {})",
                self.bytes_c(arg(0)?, sc, dollar)?
            ))),
            Builtin::Before => {
                let (a, b) = (self.bytes_c(arg(0)?, sc, dollar)?, self.bytes_c(arg(1)?, sc, dollar)?);
                format!("Val::Bytes(before({a}, {b}))")
            }
            Builtin::After => {
                let (a, b) = (self.bytes_c(arg(0)?, sc, dollar)?, self.bytes_c(arg(1)?, sc, dollar)?);
                format!("Val::Bytes(after({a}, {b}))")
            }
            Builtin::Trim => format!("Val::Bytes(trim({}))", self.bytes_c(arg(0)?, sc, dollar)?),
            Builtin::CNumber => format!("Val::Bytes(c_number({}))", self.bytes_c(arg(0)?, sc, dollar)?),
            // As the evaluator's: a negative length fails.
            Builtin::Prefix => {
                let (b, n) = (self.bytes_c(arg(0)?, sc, dollar)?, self.int_c(arg(1)?, sc, dollar)?);
                format!(
                    "{{ let b: &[u8] = {b}; let n: i128 = {n}; match usize::try_from(n) {{ Ok(n) => Val::Bytes(&b[..b.len().min(n)]), Err(_) => {FB} }} }}"
                )
            }
            Builtin::Only => {
                let (a, b) = (self.bytes_c(arg(0)?, sc, dollar)?, self.bytes_c(arg(1)?, sc, dollar)?);
                int(format!("only({a}, {b})"))
            }
            Builtin::PctEncoded => int(format!("pct_encoded({})", self.bytes_c(arg(0)?, sc, dollar)?)),
            // As the evaluator's `elem`, in place.
            Builtin::Elem => {
                let list = self.val(arg(0)?, sc, dollar)?;
                let field = elem_field(2)?;
                let i = self.int_c(arg(1)?, sc, dollar)?;
                format!(
                    "(match {list} {{ Val::List {{ count, base, elem_slots }} => {{ let i: i128 = {i}; if i < 0 || i >= count as i128 {{ Val::Unset }} else {{ val_of(buf, s.get(base + i as usize * elem_slots as usize + {field}).copied().unwrap_or(Slot::Unset)) }} }}, _ => {FB} }})"
                )
            }
            Builtin::Present => int(format!(
                "!matches!({}, Val::Unset)",
                self.val(arg(0)?, sc, dollar)?
            )),
            Builtin::Count | Builtin::Lookup if self.folded(args, sc).is_some() => {
                let k = self.folded(args, sc).expect("checked");
                let (count, last) = (self.fused[k].count.clone(), self.fused[k].last.clone());
                if f == Builtin::Count {
                    format!("Val::Int({count} as i128)")
                } else {
                    format!(
                        "(match {last} {{ Some(b) => val_of(buf, s[b + {}]), None => Val::Unset }})",
                        elem_field(3)?
                    )
                }
            }
            Builtin::Count | Builtin::Lookup | Builtin::AllSame => {
                let list = self.val(arg(0)?, sc, dollar)?;
                let field = elem_field(1)?;
                let key = self.bytes_c(arg(2)?, sc, dollar)?;
                match f {
                    Builtin::Count => format!(
                        "Val::Int({})",
                        opt(format!("count(s, buf, {list}, {field}, {key})"))
                    ),
                    Builtin::Lookup => opt(format!(
                        "lookup(s, buf, {list}, {field}, {key}, {})",
                        elem_field(3)?
                    )),
                    _ => int(opt(format!(
                        "all_same(s, buf, {list}, {field}, {key}, {})",
                        elem_field(3)?
                    ))),
                }
            }
            #[allow(unreachable_patterns)]
            _ => return Err(no()),
        })
    }

    /// The fused lookup a `count`/`lookup` call's arguments name, if its
    /// list's loop counted it.
    fn folded(&self, args: &[CExpr], sc: &Scope) -> Option<usize> {
        let (Base::Static(b), [CExpr::List(l), CExpr::ElemField(f), CExpr::Str(key), ..]) =
            (&sc.base, args)
        else {
            return None;
        };
        let list = b + l.slot as usize;
        self.fused
            .iter()
            .rposition(|x| x.list == list && x.field == *f && x.key == *key)
    }

    fn operand(&mut self, x: Operand, sc: &Scope, dollar: &(String, Option<String>)) -> String {
        match x {
            Operand::Slot(s) => self.read(sc, s),
            Operand::Dollar => dollar.0.clone(),
        }
    }

    fn node(
        &mut self,
        n: &Node,
        sc: &mut Scope,
        dollar: &(String, Option<String>),
    ) -> Result<String, Unsupported> {
        let checked = |x: String| format!("(match {x} {{ Some(v) => v, None => {FB} }})");
        Ok(match n {
            Node::Not(x) => format!("(({} == 0) as i128)", self.int(x, sc, dollar)?),
            Node::Neg(x) => checked(format!("{}.checked_neg()", self.int(x, sc, dollar)?)),
            Node::And(x, y) => {
                let (a, b) = (self.int(x, sc, dollar)?, self.int(y, sc, dollar)?);
                format!("(if {a} != 0 {{ ({b} != 0) as i128 }} else {{ 0 }})")
            }
            Node::Or(x, y) => {
                let (a, b) = (self.int(x, sc, dollar)?, self.int(y, sc, dollar)?);
                format!("(if {a} != 0 {{ 1 }} else {{ ({b} != 0) as i128 }})")
            }
            Node::Add(x, y) => {
                let (a, b) = (self.int(x, sc, dollar)?, self.int(y, sc, dollar)?);
                checked(format!("{a}.checked_add({b})"))
            }
            Node::Sub(x, y) => {
                let (a, b) = (self.int(x, sc, dollar)?, self.int(y, sc, dollar)?);
                checked(format!("{a}.checked_sub({b})"))
            }
            Node::Mul(x, y) | Node::Div(x, y) | Node::Mod(x, y) => {
                let f = match n {
                    Node::Mul(..) => "mul",
                    Node::Div(..) => "div",
                    _ => "rem",
                };
                let (a, b) = (self.int(x, sc, dollar)?, self.int(y, sc, dollar)?);
                checked(format!("{f}({a}, {b})"))
            }
            Node::Lt(x, y) => {
                let (a, b) = (self.int(x, sc, dollar)?, self.int(y, sc, dollar)?);
                format!("(({a} < {b}) as i128)")
            }
            Node::Le(x, y) => {
                let (a, b) = (self.int(x, sc, dollar)?, self.int(y, sc, dollar)?);
                format!("(({a} <= {b}) as i128)")
            }
            Node::EqInt { x, e, eq } => {
                let v = self.operand(*x, sc, dollar);
                let r = self.int(e, sc, dollar)?;
                if let Some(i) = self.ints.get(&v) {
                    return Ok(format!("((({i} == {r}) == {eq}) as i128)"));
                }
                format!(
                    "(match value(buf, {v}) {{ Some(Err(v)) => ((v == {r}) == {eq}) as i128, None => {{ let _ = {r}; (!{eq}) as i128 }}, Some(Ok(_)) => {FB} }})"
                )
            }
            Node::EqBytes { x, s, eq } => {
                let v = self.operand(*x, sc, dollar);
                format!(
                    "(match value(buf, {v}) {{ Some(Ok(b)) => ((b == &{}[..]) == {eq}) as i128, None => (!{eq}) as i128, Some(Err(_)) => {FB} }})",
                    lit(s)
                )
            }
            Node::EqBoth(x, y, eq) => {
                let (a, b) = (self.int(x, sc, dollar)?, self.int(y, sc, dollar)?);
                format!("((({a} == {b}) == {eq}) as i128)")
            }
            Node::Chain(start, ops) => {
                let x = self.int(start, sc, dollar)?;
                chain(&x, ops)
            }
            Node::BytesTest(f, x, _) => {
                let v = self.operand(*x, sc, dollar);
                format!(
                    "(match (match value(buf, {v}) {{ Some(Ok(b)) => bytes_test(Builtin::{f:?}, b), None => bytes_test(Builtin::{f:?}, &[]), Some(Err(_)) => None }}) {{ Some(t) => t as i128, None => {FB} }})"
                )
            }
            Node::General(c) => {
                if let Ok(v) = self.int_c(c, sc, dollar) {
                    return Ok(v);
                }
                let k = self.general(c);
                let d = dollar
                    .1
                    .as_ref()
                    .map_or("None".to_string(), |d| format!("Some({d})"));
                checked(format!(
                    "general_int(cx, {k}, s, {}, buf, {d})",
                    sc.base.expr()
                ))
            }
        })
    }
}

/// The `(field, key)` of every `count`/`lookup` over the list at slot
/// `list` in `op` and the blocks it enters (not nested units, whose slots
/// are their own).
fn lookups_of(
    g: &Grammar,
    op: &crate::program::Op,
    list: u16,
    out: &mut Vec<(u16, std::sync::Arc<[u8]>)>,
    depth: usize,
) {
    fn walk(e: &CExpr, list: u16, out: &mut Vec<(u16, std::sync::Arc<[u8]>)>) {
        match e {
            CExpr::Call(Builtin::Count | Builtin::Lookup, args) => {
                if let [CExpr::List(l), CExpr::ElemField(f), CExpr::Str(k), ..] = &args[..] {
                    if l.slot == list && !out.iter().any(|(g, x)| g == f && x == k) {
                        out.push((*f, k.clone()));
                    }
                }
                args.iter().for_each(|a| walk(a, list, out));
            }
            CExpr::Call(_, args) => args.iter().for_each(|a| walk(a, list, out)),
            CExpr::Unary(_, x) => walk(x, list, out),
            CExpr::Binary(_, a, b) => {
                walk(a, list, out);
                walk(b, list, out);
            }
            _ => {}
        }
    }
    if depth > 32 {
        return;
    }
    if let Some(r) = &op.requires {
        walk(r, list, out);
    }
    match &op.kind {
        OpKind::Var(e) => walk(e, list, out),
        OpKind::Scalar(Scalar::Bytes {
            len: Len::Expr(e), ..
        }) => walk(e, list, out),
        OpKind::Switch { on, cases, default } => {
            walk(on, list, out);
            for b in cases.iter().map(|(_, b)| *b).chain(*default) {
                for inner in &g.blocks[b as usize] {
                    lookups_of(g, inner, list, out, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// Whether a step's only check is `is_token($$)`.
fn is_token_check(step: &crate::plan::Step) -> bool {
    let Some(c) = &step.check else { return false };
    matches!(&c.expr, IntExpr::Node(n) if matches!(**n, Node::BytesTest(Builtin::IsToken, Operand::Dollar, _)))
}

/// The integer inside a `Val::Int(..)` expression that `val` wrote,
/// if that is all it is.
fn int_val(v: &str) -> Option<&str> {
    let inner = v.strip_prefix("Val::Int(")?.strip_suffix(')')?;
    // `Val::Int(a) ... Val::Int(b)` would strip to an unbalanced inside.
    let mut depth = 0i32;
    for c in inner.bytes() {
        match c {
            b'(' => depth += 1,
            b')' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return None;
        }
    }
    (depth == 0).then_some(inner)
}

fn unset() -> (String, Option<String>) {
    ("Slot::Unset".to_string(), None)
}

/// Operations with constants applied to `x`, as [`crate::int_expr::apply`].
fn chain(x: &str, ops: &[ConstOp]) -> String {
    let mut s = format!("{{ let mut v: i128 = {x};");
    let checked = |f: String| format!(" v = match {f} {{ Some(v) => v, None => {FB} }};");
    for op in ops {
        s.push_str(&match *op {
            ConstOp::Add(c) => checked(format!("v.checked_add({c})")),
            ConstOp::Sub(c) => checked(format!("v.checked_sub({c})")),
            ConstOp::Mul(c) => checked(format!("mul(v, {c})")),
            ConstOp::Div(c) => checked(format!("div(v, {c})")),
            ConstOp::Mod(c) => checked(format!("rem(v, {c})")),
            ConstOp::Shr(k) => format!(
                " v = if v >= 0 {{ v >> {k} }} else {{ match div(v, 1i128 << {k}) {{ Some(v) => v, None => {FB} }} }};"
            ),
            ConstOp::Mask(m) => format!(
                " v = if v >= 0 {{ v & {m} }} else {{ match rem(v, {m} + 1) {{ Some(v) => v, None => {FB} }} }};"
            ),
            ConstOp::Lt(c) => format!(" v = (v < {c}) as i128;"),
            ConstOp::Le(c) => format!(" v = (v <= {c}) as i128;"),
            ConstOp::Gt(c) => format!(" v = (v > {c}) as i128;"),
            ConstOp::Ge(c) => format!(" v = (v >= {c}) as i128;"),
        });
    }
    s.push_str(" v }");
    s
}

/// A binary integer of `width` bytes at `off` in slice `r`, as Rust of
/// type `i64` if `signed`, else `u64`.
fn int_decode(r: &str, off: usize, width: u8, signed: bool, little: bool) -> String {
    let bytes: Vec<String> = (0..width as usize)
        .map(|k| format!("{r}[{}]", off + k))
        .collect();
    let arr = bytes.join(", ");
    let end = if little { "le" } else { "be" };
    let raw = match width {
        1 => format!("({r}[{off}] as u64)"),
        2 => format!("(u16::from_{end}_bytes([{arr}]) as u64)"),
        4 => format!("(u32::from_{end}_bytes([{arr}]) as u64)"),
        8 => format!("u64::from_{end}_bytes([{arr}])"),
        _ => {
            let order: Vec<&String> = if little {
                bytes.iter().rev().collect()
            } else {
                bytes.iter().collect()
            };
            let mut e = String::from("0u64");
            for b in order {
                e = format!("(({e} << 8) | {b} as u64)");
            }
            e
        }
    };
    if signed {
        let shift = 64 - 8 * width as u32;
        format!("((({raw} << {shift}) as i64) >> {shift})")
    } else {
        raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The code of one unit: from its doc line to the next unit's.
    fn unit_code<'a>(code: &'a str, unit: &str) -> &'a str {
        let start = code
            .find(&format!("/// `{unit}`.\n"))
            .expect("the unit's function");
        let end = code[start..]
            .find(&format!("/// `{unit}` in a batch's loop."))
            .expect("its batch wrapper");
        &code[start..start + end]
    }

    #[test]
    fn an_integer_variable_compares_as_a_number() {
        // `key_size`'s `&requires = $$ == self.key_len`: a number against
        // a field, so no evaluator call per record.
        let g = Grammar::stock("hadoop_ifile").unwrap();
        let gen = generate(&g);
        for unit in ["kv", "text_int_record"] {
            let code = unit_code(&gen.code, unit);
            assert!(code.contains("slot_int("), "{unit}: {code}");
            assert!(!code.contains("equal("), "{unit}: {code}");
        }
    }

    #[test]
    fn a_variable_past_64_bits_reads_back_as_its_slot_holds_it() {
        use crate::rt::{int, slot_int, slot_of};
        for v in [
            0i128,
            1,
            -1,
            i64::MAX as i128,
            i64::MIN as i128,
            u64::MAX as i128,
            u64::MAX as i128 + 1,
            u64::MAX as i128 + 7,
            i64::MIN as i128 - 1,
            -(1i128 << 70) - 5,
        ] {
            assert_eq!(Some(slot_int(v)), int(slot_of(v)), "{v}");
        }
    }

    #[test]
    fn int_val_takes_only_a_whole_number() {
        assert_eq!(int_val("Val::Int((i3 as i128))"), Some("(i3 as i128)"));
        assert_eq!(int_val("Val::Int(j4)"), Some("j4"));
        assert_eq!(int_val("val_of(buf, v2)"), None);
        assert_eq!(int_val("Val::Int(a) == f(Val::Int(b)"), None);
    }
}
