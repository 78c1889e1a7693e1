//! The compiled form of a grammar: per unit, a block of operations over a
//! fixed array of value slots. Parsing and serialising interpret it.

use crate::grammar::ast::{BinOp, ByteOrder, UnOp};
use std::sync::Arc;

pub type BlockId = u32;
pub type UnitId = usize;

/// A value slot. Byte ranges index the buffer the message was parsed from
/// (or a builder's data), so slots hold no heap data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Slot {
    #[default]
    Unset,
    Int(u64),
    /// A signed integer (`int8`..`int64`, `vint`).
    SInt(i64),
    Bytes {
        start: u32,
        len: u32,
    },
    /// The number of elements of a list.
    Count(u32),
}

/// A built-in function of grammar expressions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    /// Length of bytes, or element count of a list.
    Len,
    /// ASCII decimal digits to an integer.
    ToInt,
    /// Case-insensitive equality of bytes.
    EqNocase,
    /// Case-insensitive: does a comma-separated list of tokens end with
    /// the token (as `Transfer-Encoding: gzip, chunked`)?
    LastTokenNocase,
    /// `lookup(list, "field", KEY, "value")`: the `value` field of the last
    /// element whose `field` equals KEY case-insensitively.
    Lookup,
    /// `count(list, "field", KEY)`: elements whose `field` matches KEY.
    Count,
    /// `all_same(list, "field", KEY, "value")`: whether every matching
    /// element carries the same value.
    AllSame,
    /// Does bytes end with a space or tab?
    EndsWithWs,
    /// Does bytes start with a space or tab?
    StartsWithWs,
    /// Is bytes a valid ASCII decimal or hexadecimal number?
    IsDec,
    IsHex,
    /// ASCII hexadecimal digits to an integer.
    HexToInt,
    /// Is the slot set (an optional field present)?
    Present,
    /// `reply_context()`: what the request being answered said of its
    /// reply (`%reply_context`).
    ReplyContext,
    /// `choose(c, a, b)`: `a` if `c` holds, else `b` (only the one chosen
    /// is evaluated): a reply's text by the status of an error.
    Choose,
    /// Is bytes a non-empty HTTP token (RFC 9110 `tchar`s)?
    IsToken,
    /// Does a comma-separated list contain the token, case-insensitively?
    HasTokenNocase,
    /// The bytes before the first occurrence of a separator (or all).
    Before,
    /// The bytes after the first occurrence of a separator (or none).
    After,
    /// The bytes without the spaces and tabs around them.
    Trim,
    /// `c_number(b)`: what C's `strtol` reads of a token as memcached
    /// checks it: leading whitespace (`isspace`: space, `\t`, `\n`, `\v`,
    /// `\f`, `\r`) skipped, then the bytes up to the next whitespace,
    /// which ends the number (`1\x0bjunk` is 1, `1junk` is no number).
    CNumber,
    /// `prefix(b, n)`: the first n bytes of b (all of b if shorter); a
    /// Memcached meta flag is its token's first byte.
    Prefix,
    /// `only(b, "CLASS")`: is every byte of b in the class? The class is
    /// compiled to a 256-bit map (32 bytes, bit `c % 8` of byte `c / 8`),
    /// the call's second argument.
    Only,
    /// Is every `%` in bytes the start of a percent-encoding (`%` and two
    /// hexadecimal digits, RFC 3986 section 2.1)?
    PctEncoded,
    /// `elem(list, INDEX, "field")`: a field of a list's element, unset
    /// when there is no such element (an optional trailing argument).
    Elem,
    /// `limit("name", DEFAULT)`: a limit the grammar lets its user set
    /// when it loads ([`Grammar::set_limit`](crate::Grammar::set_limit)),
    /// DEFAULT unless set. Compiled to the limit's index and its default.
    Limit,
    /// `streamed()`: the bytes of the `&stream` fields of the message
    /// begun so far (each counted whole once its length is known): a
    /// chunked body's size before its next chunk.
    Streamed,
}

#[derive(Clone, Debug)]
pub enum CExpr {
    Int(i128),
    Str(Arc<[u8]>),
    /// A slot, relative to the current unit's base.
    Slot(u16),
    /// A list: its count slot, element layout and field name table.
    List(ListRef),
    /// `$$`: the value being checked or serialised.
    Dollar,
    /// `$$.field`: a field of the list element just parsed.
    DollarField(u16),
    Unary(UnOp, Box<CExpr>),
    Binary(BinOp, Box<CExpr>, Box<CExpr>),
    Call(Builtin, Vec<CExpr>),
    /// A field name argument of `lookup`/`count`, resolved in the element.
    ElemField(u16),
}

#[derive(Clone, Copy, Debug)]
pub struct ListRef {
    /// Count slot, relative to the current base; elements follow it.
    pub slot: u16,
    pub elem_slots: u16,
}

/// How long a bytes field is.
#[derive(Clone, Debug)]
pub enum Len {
    Expr(CExpr),
    /// Up to (not including) a delimiter, which is consumed.
    Until(Arc<[u8]>),
    /// To the end of the stream (`&eof`; see [`Parser::finish`](crate::Parser::finish)).
    Eof,
    /// `&before_any`: up to (not including) the first of these bytes, which
    /// is left for the next field; at least one byte (a token of a line).
    /// The second is `&before_also`, a sequence that ends it too (empty
    /// when none): `"\r\n"` ends a Memcached token where a lone `\r` is
    /// one of its bytes.
    BeforeAny(Arc<[u8]>, Arc<[u8]>),
    /// `&while_any`: the bytes of this set there are (none, or up to the
    /// field's maximum); the first other byte is left for the next field.
    /// Written as nothing: what it skips is not passed on.
    WhileAny(Arc<[u8]>),
}

/// When a list ends.
#[derive(Clone, Debug)]
pub enum Stop {
    Count(CExpr),
    /// Before a terminator, which is consumed.
    Until(Arc<[u8]>),
    /// Before either terminator (`&until` and `&until_also`), which is
    /// consumed; the first where both match. Serialising writes the first.
    UntilEither(Arc<[u8]>, Arc<[u8]>),
    /// After the element for which the expression (over `$$`) holds.
    UntilElem(CExpr),
}

#[derive(Clone, Debug)]
pub enum Elem {
    Unit { block: BlockId, slots: u16 },
    Scalar(Box<Scalar>),
}

/// A field read in one step: enough bytes or none consumed.
#[derive(Clone, Debug)]
pub enum Scalar {
    Int {
        bytes: u8,
        signed: bool,
        order: ByteOrder,
    },
    Bytes {
        len: Len,
        max: u32,
    },
    AsciiInt {
        until: Arc<[u8]>,
        hex: bool,
        /// `&before_any`: `until` is a set of bytes, and is not consumed.
        before: bool,
        /// `int8`..`int64` take a leading `-`; the value must fit the type.
        signed: bool,
        bytes: u8,
    },
    VInt,
    Literal {
        bytes: Arc<[u8]>,
        nocase: bool,
    },
    Ws,
}

#[derive(Clone, Debug)]
pub struct Op {
    pub kind: OpKind,
    /// The grammar field this operation reads, for errors.
    pub field: Arc<str>,
    /// Where the value goes, relative to the unit's base; `None` skips it.
    pub slot: Option<u16>,
    /// `&requires`: a condition over `$$` and earlier fields.
    pub requires: Option<CExpr>,
    /// The protocol status a proxy answers when this field is bad (`&error`).
    pub status: Option<u16>,
    /// `&stream`: delivered in pieces as it arrives, never held whole.
    pub stream: bool,
    /// `&forbid`: bytes that must not occur before an `&until` delimiter
    /// (a header name may not run past its line).
    pub forbid: Option<Arc<[u8]>>,
}

#[derive(Clone, Debug)]
pub enum OpKind {
    Scalar(Scalar),
    Var(CExpr),
    Switch {
        on: CExpr,
        cases: Vec<(CExpr, BlockId)>,
        default: Option<BlockId>,
    },
    Unit {
        block: BlockId,
    },
    List {
        elem: Elem,
        stop: Stop,
        sep: Option<Arc<[u8]>>,
        max: u32,
        /// `&max_bytes`: the most bytes the whole list may take.
        max_bytes: Option<u32>,
    },
    /// Where the unit begins in the message, stored in `slot` so that its
    /// fields read in place ([`Fixed`]) can be found. First in a unit's
    /// block, and only in units that have such fields.
    Mark,
    /// `&serialize` of a variable: after lengths are known, set `target`.
    SerializeVar {
        var: u16,
        target: u16,
        expr: CExpr,
    },
}

/// What `flick` knows of a unit: its layout and its named fields.
#[derive(Clone, Debug)]
pub struct UnitInfo {
    pub name: String,
    pub block: BlockId,
    pub slots: u16,
    /// Named fields and variables, with their slots (relative to the unit).
    pub fields: Vec<FieldInfo>,
    /// `%fault`: slots of a reply to set, and how, from the request's values.
    pub fault: Vec<(u16, CExpr)>,
    /// `%end`: slots of the message that closes a written stream, and how.
    pub end: Vec<(u16, CExpr)>,
    /// `%reject`: slots of the reply to a request that does not parse.
    pub reject: Vec<(u16, CExpr)>,
    /// Routing properties (`%broadcast`, `%more`, `%correlate`), compiled.
    pub properties: Vec<(String, CExpr)>,
    /// How each of `properties` is read (see `property.rs`).
    pub(crate) property_forms: Vec<crate::property::PropertyForm>,
    /// Each of `properties`' name as a word (see `property.rs`).
    pub(crate) property_keys: Vec<u64>,
    /// Where each routing property is among `properties` (see
    /// `property.rs`).
    pub(crate) routing: [u8; crate::property::ROUTING_COUNT],
    /// `%forward`: edits to a top-level list of units when a proxy passes
    /// a message on.
    pub forward: Option<Forward>,
    /// The leading run of fixed-width fields, where the unit has fields
    /// read in place: a header read whole ([`Message::header`]).
    ///
    /// [`Message::header`]: crate::Message::header
    pub fixed_run: Option<FixedRun>,
}

/// A unit's leading fixed-width fields as one run of bytes: every message
/// of the unit begins with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedRun {
    /// The unit's slot that says where it begins ([`OpKind::Mark`]).
    pub start: u16,
    /// The run's length in bytes.
    pub len: u16,
}

/// `%forward`, compiled: which list, which elements to leave out, and
/// which to append.
#[derive(Clone, Debug)]
pub struct Forward {
    /// The list's count slot (relative to the unit); elements follow it.
    pub list: u16,
    pub elem_slots: u16,
    /// Leave out elements whose field at this slot (relative to the
    /// element) equals one of these, ignoring ASCII case.
    pub drop: Vec<(u16, Vec<Arc<[u8]>>)>,
    pub add: Vec<Add>,
    /// How a message is copied rather than written, made at its first
    /// forward (`crate::verbatim`).
    pub(crate) copying: std::sync::OnceLock<Option<crate::verbatim::CopyPlan>>,
}

/// An element appended by `%forward`: its bytes, when the condition holds.
#[derive(Clone, Debug)]
pub struct Add {
    pub parts: Vec<AddPart>,
    pub when: When,
}

#[derive(Clone, Debug)]
pub enum AddPart {
    /// A value over the message (`self.x`, a literal): bytes as they are,
    /// integers in decimal.
    Expr(CExpr),
    /// `peer_address()`: the address of the connection the message came
    /// from, as text (the client of a request).
    PeerAddress,
}

#[derive(Clone, Debug)]
pub enum When {
    Always,
    /// An expression over the message.
    Expr(CExpr),
    /// `session_ends()` (or its negation): whether the client's connection
    /// closes after this message.
    SessionEnds(bool),
}

/// What a `%forward` edit may ask of the connection a message travels on.
#[derive(Clone, Copy, Debug, Default)]
pub struct ForwardContext<'a> {
    /// The address of the connection the message came from, as text.
    pub peer_address: &'a [u8],
    /// The client's connection closes after this message.
    pub session_ends: bool,
}

#[derive(Clone, Debug)]
pub struct FieldInfo {
    pub name: String,
    pub slot: u16,
    pub kind: FieldKind,
    /// The most bytes the value can have, for scalar fields.
    pub max_bytes: Option<u64>,
    /// Where the value lies in the message, for a field at a fixed offset
    /// in its unit (see [`Fixed`]).
    pub fixed: Option<Fixed>,
}

/// A field at a fixed offset from the start of its unit, which a parser
/// may leave in the message's bytes and a reader decode when asked
/// ([`Parser::in_place`](crate::Parser::in_place)): a header's fixed
/// part, and the bit fields and copies of its unsigned integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixed {
    /// The unit's slot that says where it begins ([`OpKind::Mark`]),
    /// relative to the unit.
    pub start: u16,
    /// Bytes from the unit's start to the field's first byte.
    pub offset: u16,
    pub kind: FixedKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FixedKind {
    /// An unsigned integer of `width` bytes, shifted right by `shift` and
    /// masked with `mask`.
    Int {
        width: u8,
        little: bool,
        shift: u8,
        mask: u64,
    },
    Bytes {
        len: u16,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldKind {
    Int,
    Bytes,
    List {
        elem_unit: Option<UnitId>,
        elem_slots: u16,
    },
    Unit(UnitId),
}
