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
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    pub decls: Vec<Decl>,
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExprKind {
    /// An integer literal; `hex` records how it was written, for `fmt`.
    Int {
        value: u64,
        hex: bool,
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
