//! The abstract syntax tree of a Flick program.
//!
//! Every node carries the [`Span`] of the text it came from. Two trees are
//! compared for equality after [`Program::erase_spans`], which is how the
//! formatter's round-trip property is stated.

use flick_span::Span;

/// An identifier with its location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

impl Ident {
    pub fn new(name: impl Into<String>, span: Span) -> Ident {
        Ident {
            name: name.into(),
            span,
        }
    }
}

/// A `#` comment, kept out of the tree so that trees compare by meaning;
/// `flick fmt` puts comments back before the node that followed them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Comment {
    pub span: Span,
    /// The comment's text from `#` to the end of its line.
    pub text: String,
    /// The token it follows on its line (`x := 1  # why`), if any.
    pub follows: Option<Span>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    pub decls: Vec<Decl>,
    /// `machine` items: per-flow state machines, which `flick-machine`
    /// lowers to its tables. Kept apart from `decls`, which become task
    /// graphs; the formatter puts both back in source order.
    pub machines: Vec<MachineDecl>,
}

/// `machine NAME: (CHANNELS)` and its indented items: a pipeline of
/// stages keeping per-flow state (FlowBlaze's model).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineDecl {
    pub name: Ident,
    /// The packet channels, numbered 1, 2, ... in this order.
    pub channels: Vec<Param>,
    pub items: Vec<MachineItem>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MachineItem {
    /// `const NAME = VALUE`.
    Const {
        name: Ident,
        value: MOperand,
        span: Span,
    },
    /// `global NAME: TYPE := VALUE`: a register every context shares.
    Global(RegisterDecl),
    /// `meta NAME: TYPE`: a per-packet word, 0 at the first stage.
    Meta(RegisterDecl),
    Stage(StageDecl),
}

/// A register or metadata word: `NAME[: TYPE] [:= VALUE]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterDecl {
    pub name: Ident,
    pub ty: Option<TypeExpr>,
    pub init: Option<MOperand>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageDecl {
    pub name: Ident,
    pub items: Vec<StageItem>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeUnit {
    Us,
    Ms,
    S,
}

impl TimeUnit {
    pub fn name(self) -> &'static str {
        match self {
            TimeUnit::Us => "us",
            TimeUnit::Ms => "ms",
            TimeUnit::S => "s",
        }
    }

    /// Microseconds in one of the unit.
    pub fn micros(self) -> u64 {
        match self {
            TimeUnit::Us => 1,
            TimeUnit::Ms => 1_000,
            TimeUnit::S => 1_000_000,
        }
    }
}

/// A duration as written: `10s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Duration {
    pub amount: u64,
    pub unit: TimeUnit,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StageItem {
    /// `key F, ...` or `key biflow (A, ...) (B, ...)`.
    Key {
        fields: Vec<MOperand>,
        /// The other endpoint's fields, for a biflow key.
        other: Option<Vec<MOperand>>,
        span: Span,
    },
    IdleTimeout(Duration),
    HardTimeout(Duration),
    /// `capacity N`.
    Capacity(MOperand),
    /// `evict oldest` or `evict expired`.
    Evict(Ident),
    /// `flow NAME: TYPE := VALUE`: a register per context.
    Flow(RegisterDecl),
    /// `states A, B, ...`: the first is the initial one.
    States(Vec<Ident>, Span),
    Transition(TransitionDecl),
}

/// `in STATE on EVENT when COND, ...: ITEM; ...` (`on EVENT ...` in a
/// stateless stage).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransitionDecl {
    /// `None` where no `in` was written.
    pub state: Option<Ident>,
    pub event: Ident,
    pub when: Vec<MCond>,
    pub actions: Vec<MAction>,
    pub span: Span,
}

/// An operand of a machine's conditions and updates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MOperand {
    pub kind: MOperandKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MOperandKind {
    /// An integer literal, written as [`ExprKind::Int`] is.
    Int {
        value: u64,
        hex: bool,
        spelling: Option<Box<str>>,
    },
    /// A dotted IPv4 address: `10.0.0.1`.
    Ipv4([u8; 4]),
    /// A register, constant, channel, `now`, `len` or `in_port`.
    Name(Ident),
    /// A packet field (`tcp.dport`) or metadata word (`meta.class`).
    Dotted(Ident, Ident),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MCond {
    /// `A OP B`, OP a comparison.
    Compare {
        lhs: MOperand,
        op: BinOp,
        rhs: MOperand,
        span: Span,
    },
    /// `from CHANNEL`: the packet came in on that channel.
    From(Ident, Span),
}

/// The value of an update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MExpr {
    Operand(MOperand),
    /// `A + B`, `A - B`, `A * B`, `A / B`, `A % B`.
    Binary(BinOp, MOperand, MOperand, Span),
    /// `max(A, B)` or `min(A, B)`.
    Call(Ident, MOperand, MOperand, Span),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MAction {
    /// `REG := EXPR`.
    Update {
        target: MOperand,
        value: MExpr,
        span: Span,
    },
    Next(Ident, Span),
    Forward(Ident, Span),
    Drop(Span),
    /// `set FIELD := VALUE`.
    Set {
        field: MOperand,
        value: MOperand,
        span: Span,
    },
    Goto(Ident, Span),
}

impl MAction {
    pub fn span(&self) -> Span {
        match self {
            MAction::Update { span, .. } | MAction::Set { span, .. } => *span,
            MAction::Next(_, s)
            | MAction::Forward(_, s)
            | MAction::Goto(_, s)
            | MAction::Drop(s) => *s,
        }
    }
}

impl MCond {
    pub fn span(&self) -> Span {
        match self {
            MCond::Compare { span, .. } | MCond::From(_, span) => *span,
        }
    }
}

impl MExpr {
    pub fn span(&self) -> Span {
        match self {
            MExpr::Operand(o) => o.span,
            MExpr::Binary(.., s) | MExpr::Call(.., s) => *s,
        }
    }
}

impl MachineItem {
    pub fn span(&self) -> Span {
        match self {
            MachineItem::Const { span, .. } => *span,
            MachineItem::Global(r) | MachineItem::Meta(r) => r.span,
            MachineItem::Stage(s) => s.span,
        }
    }
}

impl StageItem {
    pub fn span(&self) -> Span {
        match self {
            StageItem::Key { span, .. } | StageItem::States(_, span) => *span,
            StageItem::IdleTimeout(d) | StageItem::HardTimeout(d) => d.span,
            StageItem::Capacity(o) => o.span,
            StageItem::Evict(i) => i.span,
            StageItem::Flow(r) => r.span,
            StageItem::Transition(t) => t.span,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decl {
    /// `grammar memcached_binary`: records of this program whose names match
    /// units of that grammar are views of those units.
    Grammar(GrammarDecl),
    Type(TypeDecl),
    Proc(ProcDecl),
    Fun(FunDecl),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrammarDecl {
    pub name: Ident,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeDecl {
    pub name: Ident,
    pub body: TypeBody,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TypeBody {
    /// `type cmd: record` followed by an indented list of fields.
    Record(Vec<Field>),
    /// `type key: string {max=250}`, a named type expression.
    Alias(TypeExpr),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// `None` for an anonymous `_` field.
    pub name: Option<Ident>,
    pub ty: TypeExpr,
    pub span: Span,
}

/// A type as written, with its `{name=expr, ...}` annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeExpr {
    pub kind: TypeKind,
    pub annotations: Vec<Annotation>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TypeKind {
    Integer,
    String,
    Bytes,
    Bool,
    /// A record or alias by name.
    Named(Ident),
    List(Box<TypeExpr>),
    /// `()` is the empty tuple, the unit type.
    Tuple(Vec<TypeExpr>),
    Dict(Box<TypeExpr>, Box<TypeExpr>),
    Ref(Box<TypeExpr>),
    /// `In/Out`; `None` is written `-` and means that direction is unused.
    Chan(ChanType),
    /// `[In/Out]`, an array of channels.
    ChanArray(ChanType),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChanType {
    pub input: Option<Box<TypeExpr>>,
    pub output: Option<Box<TypeExpr>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Annotation {
    pub name: Ident,
    pub value: Expr,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    pub name: Ident,
    pub ty: TypeExpr,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcDecl {
    pub name: Ident,
    pub params: Vec<Param>,
    pub items: Vec<ProcItem>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcItem {
    State(StateDecl),
    Rule(Rule),
    /// `if cond:` followed by statements, run whenever `cond` holds.
    Guarded(Guarded),
    Handler(Handler),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateScope {
    /// Shared by every instance of the process.
    Global,
    /// One copy per instance (per client connection).
    Local,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDecl {
    pub scope: StateScope,
    pub name: Ident,
    pub ty: Option<TypeExpr>,
    pub init: Expr,
    pub span: Span,
}

/// `source => step => step ...`: each value read from `source` flows through
/// the steps; a call step receives it as its last argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub source: Expr,
    pub steps: Vec<Expr>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guarded {
    pub cond: Expr,
    pub body: Block,
    pub span: Span,
}

/// `on disconnect(client):` or `on disconnect(backends[i]):` followed by
/// statements, run when the peer behind the channel goes away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handler {
    pub event: Ident,
    pub channel: Ident,
    /// For a channel array, the name bound to the failed channel's index.
    pub index: Option<Ident>,
    pub body: Block,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunDecl {
    pub name: Ident,
    pub params: Vec<Param>,
    pub results: Vec<TypeExpr>,
    pub body: Block,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub stmts: Vec<Stmt>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stmt {
    pub kind: StmtKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StmtKind {
    Let {
        name: Ident,
        ty: Option<TypeExpr>,
        value: Expr,
    },
    /// `place := value`, where place is a state variable or `dict[key]`.
    Assign {
        place: Expr,
        value: Expr,
    },
    /// `value => channel`.
    Send {
        value: Expr,
        channel: Expr,
    },
    If {
        cond: Expr,
        then: Block,
        otherwise: Option<Block>,
    },
    Expr(Expr),
}

/// How `fmt` writes an integer literal that keeps no spelling of its own:
/// decimal, or lower-case hexadecimal of at least two digits (`0x0c`).
pub fn int_literal(value: u64, hex: bool) -> String {
    if hex {
        format!("0x{value:02x}")
    } else {
        value.to_string()
    }
}

/// What an integer literal keeps of its text: the text itself where
/// [`int_literal`] would write it otherwise (separators, leading zeros,
/// capitals), so that `fmt` gives it back as the author wrote it.
pub fn int_spelling(text: &str, value: u64, hex: bool) -> Option<Box<str>> {
    (text != int_literal(value, hex)).then(|| text.into())
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExprKind {
    /// An integer literal; `hex` and `spelling` record how it was
    /// written, for `fmt`.
    Int {
        value: u64,
        hex: bool,
        /// The literal as written (`0x0a01_0000`, `1_000`, `007`), where
        /// that is not [`int_literal`]'s spelling of `value`; `None` where
        /// it is, so that a tree built by hand needs none.
        spelling: Option<Box<str>>,
    },
    Str(String),
    Bool(bool),
    None,
    Var(Ident),
    /// `_` where a value is expected; always rejected by the checker.
    Anonymous,
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `e.field`; `field` is `_` for an (always rejected) anonymous access.
    Field(Box<Expr>, Ident),
    Index(Box<Expr>, Box<Expr>),
    /// A call of a function, a built-in or a record constructor.
    Call(Ident, Vec<Expr>),
    Tuple(Vec<Expr>),
    List(Vec<Expr>),
    Foldt(Box<Foldt>),
}

/// `foldt on CHANS ordering elem A, B by elem.FIELD as K: BODY`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Foldt {
    pub channels: Expr,
    pub elem: Ident,
    pub left: Ident,
    pub right: Ident,
    pub order_field: Ident,
    pub key: Ident,
    pub body: Block,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Mod => "mod",
            BinOp::Eq => "=",
            BinOp::Ne => "<>",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::And => "and",
            BinOp::Or => "or",
        }
    }

    /// Binding strength: higher binds tighter.
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 4,
            BinOp::Add | BinOp::Sub => 5,
            BinOp::Mul | BinOp::Div | BinOp::Mod => 6,
        }
    }
}

/// Precedence of prefix `not`: looser than comparison, tighter than `and`.
pub const NOT_PRECEDENCE: u8 = 3;
/// Precedence of prefix `-`: tighter than every binary operator.
pub const NEG_PRECEDENCE: u8 = 7;

impl Program {
    /// Replaces every span with [`Span::DUMMY`], so that trees parsed from
    /// differently laid-out texts compare equal when they mean the same.
    pub fn erase_spans(&mut self) {
        self.machines.iter_mut().for_each(MachineDecl::erase_spans);
        for d in &mut self.decls {
            match d {
                Decl::Grammar(g) => {
                    g.span = Span::DUMMY;
                    g.name.span = Span::DUMMY;
                }
                Decl::Type(t) => {
                    t.span = Span::DUMMY;
                    t.name.span = Span::DUMMY;
                    match &mut t.body {
                        TypeBody::Record(fields) => {
                            for f in fields {
                                f.span = Span::DUMMY;
                                if let Some(n) = &mut f.name {
                                    n.span = Span::DUMMY;
                                }
                                f.ty.erase_spans();
                            }
                        }
                        TypeBody::Alias(ty) => ty.erase_spans(),
                    }
                }
                Decl::Proc(p) => {
                    p.span = Span::DUMMY;
                    p.name.span = Span::DUMMY;
                    p.params.iter_mut().for_each(Param::erase_spans);
                    for item in &mut p.items {
                        match item {
                            ProcItem::State(s) => {
                                s.span = Span::DUMMY;
                                s.name.span = Span::DUMMY;
                                if let Some(t) = &mut s.ty {
                                    t.erase_spans();
                                }
                                s.init.erase_spans();
                            }
                            ProcItem::Rule(r) => {
                                r.span = Span::DUMMY;
                                r.source.erase_spans();
                                r.steps.iter_mut().for_each(Expr::erase_spans);
                            }
                            ProcItem::Guarded(g) => {
                                g.span = Span::DUMMY;
                                g.cond.erase_spans();
                                g.body.erase_spans();
                            }
                            ProcItem::Handler(h) => {
                                h.span = Span::DUMMY;
                                h.event.span = Span::DUMMY;
                                h.channel.span = Span::DUMMY;
                                if let Some(i) = &mut h.index {
                                    i.span = Span::DUMMY;
                                }
                                h.body.erase_spans();
                            }
                        }
                    }
                }
                Decl::Fun(f) => {
                    f.span = Span::DUMMY;
                    f.name.span = Span::DUMMY;
                    f.params.iter_mut().for_each(Param::erase_spans);
                    f.results.iter_mut().for_each(TypeExpr::erase_spans);
                    f.body.erase_spans();
                }
            }
        }
    }
}

impl MachineDecl {
    fn erase_spans(&mut self) {
        self.span = Span::DUMMY;
        self.name.span = Span::DUMMY;
        self.channels.iter_mut().for_each(Param::erase_spans);
        for item in &mut self.items {
            match item {
                MachineItem::Const { name, value, span } => {
                    *span = Span::DUMMY;
                    name.span = Span::DUMMY;
                    value.span = Span::DUMMY;
                    value.erase_spans();
                }
                MachineItem::Global(r) | MachineItem::Meta(r) => r.erase_spans(),
                MachineItem::Stage(st) => {
                    st.span = Span::DUMMY;
                    st.name.span = Span::DUMMY;
                    st.items.iter_mut().for_each(StageItem::erase_spans);
                }
            }
        }
    }
}

impl RegisterDecl {
    fn erase_spans(&mut self) {
        self.span = Span::DUMMY;
        self.name.span = Span::DUMMY;
        if let Some(t) = &mut self.ty {
            t.erase_spans();
        }
        if let Some(i) = &mut self.init {
            i.erase_spans();
        }
    }
}

impl StageItem {
    fn erase_spans(&mut self) {
        match self {
            StageItem::Key {
                fields,
                other,
                span,
            } => {
                *span = Span::DUMMY;
                fields.iter_mut().for_each(MOperand::erase_spans);
                if let Some(o) = other {
                    o.iter_mut().for_each(MOperand::erase_spans);
                }
            }
            StageItem::IdleTimeout(d) | StageItem::HardTimeout(d) => d.span = Span::DUMMY,
            StageItem::Capacity(o) => o.erase_spans(),
            StageItem::Evict(i) => i.span = Span::DUMMY,
            StageItem::Flow(r) => r.erase_spans(),
            StageItem::States(names, span) => {
                *span = Span::DUMMY;
                names.iter_mut().for_each(|n| n.span = Span::DUMMY);
            }
            StageItem::Transition(t) => {
                t.span = Span::DUMMY;
                if let Some(s) = &mut t.state {
                    s.span = Span::DUMMY;
                }
                t.event.span = Span::DUMMY;
                for c in &mut t.when {
                    match c {
                        MCond::Compare { lhs, rhs, span, .. } => {
                            *span = Span::DUMMY;
                            lhs.erase_spans();
                            rhs.erase_spans();
                        }
                        MCond::From(i, span) => {
                            *span = Span::DUMMY;
                            i.span = Span::DUMMY;
                        }
                    }
                }
                for a in &mut t.actions {
                    match a {
                        MAction::Update {
                            target,
                            value,
                            span,
                        } => {
                            *span = Span::DUMMY;
                            target.erase_spans();
                            match value {
                                MExpr::Operand(o) => o.erase_spans(),
                                MExpr::Binary(_, a, b, s) => {
                                    *s = Span::DUMMY;
                                    a.erase_spans();
                                    b.erase_spans();
                                }
                                MExpr::Call(f, a, b, s) => {
                                    *s = Span::DUMMY;
                                    f.span = Span::DUMMY;
                                    a.erase_spans();
                                    b.erase_spans();
                                }
                            }
                        }
                        MAction::Set { field, value, span } => {
                            *span = Span::DUMMY;
                            field.erase_spans();
                            value.erase_spans();
                        }
                        MAction::Next(i, s) | MAction::Forward(i, s) | MAction::Goto(i, s) => {
                            *s = Span::DUMMY;
                            i.span = Span::DUMMY;
                        }
                        MAction::Drop(s) => *s = Span::DUMMY,
                    }
                }
            }
        }
    }
}

impl MOperand {
    fn erase_spans(&mut self) {
        self.span = Span::DUMMY;
        match &mut self.kind {
            MOperandKind::Name(i) => i.span = Span::DUMMY,
            MOperandKind::Dotted(a, b) => {
                a.span = Span::DUMMY;
                b.span = Span::DUMMY;
            }
            MOperandKind::Int { .. } | MOperandKind::Ipv4(_) => {}
        }
    }
}

impl Param {
    fn erase_spans(&mut self) {
        self.span = Span::DUMMY;
        self.name.span = Span::DUMMY;
        self.ty.erase_spans();
    }
}

impl TypeExpr {
    fn erase_spans(&mut self) {
        self.span = Span::DUMMY;
        for a in &mut self.annotations {
            a.span = Span::DUMMY;
            a.name.span = Span::DUMMY;
            a.value.erase_spans();
        }
        match &mut self.kind {
            TypeKind::Named(n) => n.span = Span::DUMMY,
            TypeKind::List(t) | TypeKind::Ref(t) => t.erase_spans(),
            TypeKind::Tuple(ts) => ts.iter_mut().for_each(TypeExpr::erase_spans),
            TypeKind::Dict(k, v) => {
                k.erase_spans();
                v.erase_spans();
            }
            TypeKind::Chan(c) | TypeKind::ChanArray(c) => {
                if let Some(t) = &mut c.input {
                    t.erase_spans();
                }
                if let Some(t) = &mut c.output {
                    t.erase_spans();
                }
            }
            TypeKind::Integer | TypeKind::String | TypeKind::Bytes | TypeKind::Bool => {}
        }
    }
}

impl Block {
    fn erase_spans(&mut self) {
        self.span = Span::DUMMY;
        for s in &mut self.stmts {
            s.span = Span::DUMMY;
            match &mut s.kind {
                StmtKind::Let { name, ty, value } => {
                    name.span = Span::DUMMY;
                    if let Some(t) = ty {
                        t.erase_spans();
                    }
                    value.erase_spans();
                }
                StmtKind::Assign { place: a, value: b }
                | StmtKind::Send {
                    value: a,
                    channel: b,
                } => {
                    a.erase_spans();
                    b.erase_spans();
                }
                StmtKind::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    cond.erase_spans();
                    then.erase_spans();
                    if let Some(o) = otherwise {
                        o.erase_spans();
                    }
                }
                StmtKind::Expr(e) => e.erase_spans(),
            }
        }
    }
}

impl Expr {
    fn erase_spans(&mut self) {
        self.span = Span::DUMMY;
        match &mut self.kind {
            ExprKind::Var(i) => i.span = Span::DUMMY,
            ExprKind::Unary(_, e) => e.erase_spans(),
            ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
                a.erase_spans();
                b.erase_spans();
            }
            ExprKind::Field(e, f) => {
                e.erase_spans();
                f.span = Span::DUMMY;
            }
            ExprKind::Call(f, args) => {
                f.span = Span::DUMMY;
                args.iter_mut().for_each(Expr::erase_spans);
            }
            ExprKind::Tuple(es) | ExprKind::List(es) => es.iter_mut().for_each(Expr::erase_spans),
            ExprKind::Foldt(f) => {
                f.channels.erase_spans();
                for i in [
                    &mut f.elem,
                    &mut f.left,
                    &mut f.right,
                    &mut f.order_field,
                    &mut f.key,
                ] {
                    i.span = Span::DUMMY;
                }
                f.body.erase_spans();
            }
            ExprKind::Int { .. }
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::None
            | ExprKind::Anonymous => {}
        }
    }
}
