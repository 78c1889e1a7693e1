//! The tree of a grammar file, as written.

use flick_span::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteOrder {
    Big,
    Little,
}

#[derive(Clone, Debug)]
pub struct GrammarFile {
    pub name: Option<String>,
    pub byte_order: ByteOrder,
    pub enums: Vec<EnumDecl>,
    pub units: Vec<UnitDecl>,
}

#[derive(Clone, Debug)]
pub struct EnumDecl {
    pub name: String,
    pub variants: Vec<(String, u64)>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct UnitDecl {
    pub name: String,
    pub byte_order: Option<ByteOrder>,
    /// `%error = STATUS;`, the default status of the unit's failures.
    pub error: Option<u16>,
    /// `%fault = FIELD = EXPR, ...;`: the reply to a request that no peer
    /// will answer; `self` is the request.
    pub fault: Vec<(String, Expr)>,
    /// `%end = FIELD = EXPR, ...;`: the message that ends a stream of this
    /// unit's messages when its writer closes it; `$$` is the CRC32 of
    /// every byte written before it.
    pub end: Vec<(String, Expr)>,
    /// `%reject = FIELD = EXPR, ...;`: the reply to a request that does not
    /// parse, for a protocol that answers one and reads on (`%resync`).
    pub reject: Vec<(String, Expr)>,
    /// `%broadcast`, `%more`, `%correlate` = EXPR, over `self`.
    pub properties: Vec<(String, Expr)>,
    /// `%forward LIST = EDIT, ...;`: how a proxy changes a message of this
    /// unit that it passes on (HTTP's hop-by-hop header fields).
    pub forward: Option<ForwardDecl>,
    pub items: Vec<Item>,
    pub span: Span,
}

/// `%forward LIST = drop("FIELD", "NAME", ...), add(EXPR, ...) if EXPR, ...;`
#[derive(Clone, Debug)]
pub struct ForwardDecl {
    /// The list of units the edits apply to.
    pub list: String,
    pub edits: Vec<EditDecl>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum EditDecl {
    /// Leaves out the elements whose `field` equals one of `names`,
    /// ignoring ASCII case.
    Drop { field: Expr, names: Vec<Expr> },
    /// Appends an element written from the parts' values (bytes as they
    /// are, integers in decimal), when the condition holds.
    Add {
        parts: Vec<Expr>,
        when: Option<Expr>,
        span: Span,
    },
}

#[derive(Clone, Debug)]
pub enum Item {
    Field(Field),
    Var(VarDecl),
    Switch(Switch),
}

#[derive(Clone, Debug)]
pub struct Field {
    /// `None` for an anonymous field (`: uint8;`).
    pub name: Option<String>,
    pub ty: FieldType,
    pub attrs: Vec<Attr>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldType {
    /// An unsigned or signed integer of 1, 2, 4 or 8 bytes.
    Int {
        bytes: u8,
        signed: bool,
    },
    Bytes,
    String,
    /// Hadoop's variable-length integer encoding (`WritableUtils.writeVLong`).
    VInt,
    /// A literal token that must appear.
    Literal(Vec<u8>),
    /// Optional spaces and tabs.
    Ws,
    /// A unit or an enumeration, by name.
    Named(String),
    List(Box<FieldType>),
}

#[derive(Clone, Debug)]
pub struct Attr {
    pub name: String,
    pub value: Option<Expr>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct VarDecl {
    pub name: String,
    pub ty: FieldType,
    pub parse: Expr,
    /// `&serialize = self.target = EXPR`, where `$$` is the variable.
    pub serialize: Option<(String, Expr)>,
    /// `&requires = EXPR`: a condition on the computed value (`$$`).
    pub requires: Option<Expr>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Switch {
    pub on: Expr,
    pub cases: Vec<Case>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Case {
    /// Empty for the default case `*`.
    pub values: Vec<Expr>,
    pub items: Vec<Item>,
}

#[derive(Clone, Debug)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum ExprKind {
    Int(u64),
    Str(Vec<u8>),
    /// `self.a.b`: a path of field names.
    SelfField(Vec<String>),
    /// `$$`, optionally followed by `.field` for a list element.
    Dollar(Vec<String>),
    /// `Enum::Variant`.
    EnumConst(String, String),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Call(String, Vec<Expr>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Not,
    Neg,
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
