//! From a grammar's tree to its [`Grammar`](crate::Grammar): slot layouts,
//! resolved field references, limits, and the operations of each unit.

use crate::grammar::ast::*;
use crate::program::*;
use flick_span::{Diagnostic, Span};
use std::collections::HashMap;
use std::sync::Arc;

/// Maximum bytes of a `bytes`/`string` field without `&max`.
pub const DEFAULT_BYTES_MAX: u32 = 1 << 20;
/// Maximum elements of a list without `&max`.
pub const DEFAULT_LIST_MAX: u32 = 64;

pub(crate) struct Compiled {
    pub units: Vec<UnitInfo>,
    pub blocks: Vec<Vec<Op>>,
    /// `limit(..)`s by index: their names and defaults.
    pub limits: Vec<(String, i128)>,
}

/// A name visible to `self.` in the unit being compiled.
#[derive(Clone)]
struct Visible {
    slot: u16,
    kind: FieldKind,
    /// For lists: slots per element.
    elem_slots: u16,
}

struct Compiler<'a> {
    file: &'a GrammarFile,
    unit_ids: HashMap<&'a str, UnitId>,
    units: Vec<Option<UnitInfo>>,
    /// Visible names per compiled unit, for `self.a.b` paths into units.
    scopes: Vec<HashMap<String, Visible>>,
    blocks: Vec<Vec<Op>>,
    diags: Vec<Diagnostic>,
    /// Units being compiled, to reject a unit that contains itself.
    active: Vec<UnitId>,
    /// The `limit(..)`s named so far, with their defaults.
    limits: Vec<(String, i128)>,
}

pub(crate) fn compile(file: &GrammarFile) -> (Compiled, Vec<Diagnostic>) {
    let mut c = Compiler {
        file,
        unit_ids: HashMap::new(),
        units: vec![None; file.units.len()],
        scopes: vec![HashMap::new(); file.units.len()],
        blocks: Vec::new(),
        diags: Vec::new(),
        active: Vec::new(),
        limits: Vec::new(),
    };
    for (i, u) in file.units.iter().enumerate() {
        if c.unit_ids.insert(&u.name, i).is_some() {
            c.diags.push(Diagnostic::error(
                "W0101",
                format!("unit `{}` is defined twice", u.name),
                u.span,
            ));
        }
    }
    for i in 0..file.units.len() {
        c.unit(i);
    }
    let units = c
        .units
        .into_iter()
        .enumerate()
        .map(|(i, u)| {
            u.unwrap_or_else(|| UnitInfo {
                name: file.units[i].name.clone(),
                block: 0,
                slots: 0,
                fields: Vec::new(),
                fault: Vec::new(),
                end: Vec::new(),
                reject: Vec::new(),
                properties: Vec::new(),
                property_forms: Vec::new(),
                property_keys: Vec::new(),
                routing: [0; crate::property::ROUTING_COUNT],
                forward: None,
                fixed_run: None,
            })
        })
        .collect();
    (
        Compiled {
            units,
            blocks: c.blocks,
            limits: c.limits,
        },
        c.diags,
    )
}

/// Per-unit compilation state.
struct UnitCx {
    /// Inside how many switch cases the current item is.
    case_depth: u32,
    /// Names declared inside switch cases, which other cases may share.
    case_names: Vec<String>,
    order: ByteOrder,
    next_slot: u32,
    visible: HashMap<String, Visible>,
    fields: Vec<FieldInfo>,
}

impl<'a> Compiler<'a> {
    fn unit(&mut self, id: UnitId) -> Option<&UnitInfo> {
        if self.units[id].is_some() {
            return self.units[id].as_ref();
        }
        let decl = &self.file.units[id];
        if self.active.contains(&id) {
            self.diags.push(
                Diagnostic::error(
                    "W0102",
                    format!("unit `{}` contains itself", decl.name),
                    decl.span,
                )
                .hint("a message must have a bounded size; use a list with `&max` for repetition"),
            );
            return None;
        }
        self.active.push(id);
        let mut cx = UnitCx {
            case_depth: 0,
            case_names: Vec::new(),
            order: decl.byte_order.unwrap_or(self.file.byte_order),
            next_slot: 0,
            visible: HashMap::new(),
            fields: Vec::new(),
        };
        let block = self.block(&decl.items, &mut cx);
        let fixed_run = self.mark_fixed(block, &mut cx);
        self.active.pop();
        if let Some(status) = decl.error {
            self.default_status(block, status);
        }
        if cx.next_slot > u16::MAX as u32 {
            self.diags.push(
                Diagnostic::error(
                    "W0103",
                    format!(
                        "unit `{}` needs {} value slots; the limit is 65535",
                        decl.name, cx.next_slot
                    ),
                    decl.span,
                )
                .hint("lower the `&max` of its lists"),
            );
        }
        let mut assigned = |what: &str, list: &[(String, Expr)], cx: &mut UnitCx| {
            let mut out = Vec::new();
            for (field, e) in list {
                let target = cx.fields.iter().find(|f| {
                    &f.name == field && matches!(f.kind, FieldKind::Int | FieldKind::Bytes)
                });
                let Some(target) = target.map(|f| f.slot) else {
                    self.diags.push(
                        Diagnostic::error("W0113", format!("`%{what}` sets `{field}`, which is not an integer or bytes field of `{}`", decl.name), e.span)
                            .hint("it sets top-level fields of the unit"),
                    );
                    continue;
                };
                if let Some(c) = self.expr(e, cx, true) {
                    out.push((target, c));
                }
            }
            out
        };
        let fault = assigned("fault", &decl.fault, &mut cx);
        let end = assigned("end", &decl.end, &mut cx);
        let reject = assigned("reject", &decl.reject, &mut cx);
        let mut properties = Vec::new();
        for (name, e) in &decl.properties {
            if let Some(c) = self.expr(e, &mut cx, false) {
                properties.push((name.clone(), c));
            }
        }
        let forward = decl.forward.as_ref().and_then(|f| self.forward(f, &mut cx));
        self.scopes[id] = cx.visible;
        self.units[id] = Some(UnitInfo {
            name: decl.name.clone(),
            block,
            slots: cx.next_slot.min(u16::MAX as u32) as u16,
            fields: cx.fields,
            fault,
            end,
            reject,
            property_forms: properties
                .iter()
                .map(|(_, e)| crate::property::PropertyForm::of(e))
                .collect(),
            property_keys: properties
                .iter()
                .map(|(n, _)| crate::property::name_key(n))
                .collect(),
            routing: crate::property::routing_table(&properties),
            properties,
            forward,
            fixed_run,
        });
        self.units[id].as_ref()
    }

    /// `%forward LIST = EDIT, ...;`, compiled against the unit's fields.
    fn forward(&mut self, f: &ForwardDecl, cx: &mut UnitCx) -> Option<Forward> {
        let list = cx.visible.get(&f.list).cloned();
        let (list, elem_slots, scope) = match list {
            Some(Visible {
                slot,
                kind: FieldKind::List {
                    elem_unit: Some(u), ..
                },
                elem_slots,
            }) => (slot, elem_slots, self.scopes[u].clone()),
            _ => {
                self.diags.push(
                    Diagnostic::error(
                        "W0114",
                        format!(
                            "`%forward` edits `{}`, which is not a list of units",
                            f.list
                        ),
                        f.span,
                    )
                    .hint(
                        "it edits a top-level list whose elements are units, like HTTP's `headers`",
                    ),
                );
                return None;
            }
        };
        let mut out = Forward {
            list,
            elem_slots,
            drop: Vec::new(),
            add: Vec::new(),
            copying: Default::default(),
        };
        let string = |e: &Expr| match &e.kind {
            ExprKind::Str(s) => Some(Arc::<[u8]>::from(s.as_slice())),
            _ => None,
        };
        for edit in &f.edits {
            match edit {
                EditDecl::Drop { field, names } => {
                    let slot = string(field)
                        .and_then(|n| scope.get(std::str::from_utf8(&n).unwrap_or("")).cloned())
                        .filter(|v| v.kind == FieldKind::Bytes)
                        .map(|v| v.slot);
                    let Some(slot) = slot else {
                        self.diags.push(Diagnostic::error(
                            "W0114",
                            "`drop` names a bytes field of the list's elements, as a string",
                            field.span,
                        ));
                        continue;
                    };
                    let mut values = Vec::new();
                    for n in names {
                        match string(n) {
                            Some(v) => values.push(v),
                            None => self.diags.push(Diagnostic::error(
                                "W0114",
                                "`drop` compares with strings",
                                n.span,
                            )),
                        }
                    }
                    out.drop.push((slot, values));
                }
                EditDecl::Add { parts, when, .. } => {
                    let mut ps = Vec::new();
                    for p in parts {
                        match &p.kind {
                            ExprKind::Call(name, args)
                                if name == "peer_address" && args.is_empty() =>
                            {
                                ps.push(AddPart::PeerAddress)
                            }
                            _ => ps.extend(self.expr(p, cx, false).map(AddPart::Expr)),
                        }
                    }
                    let when = match when.as_ref().map(|w| &w.kind) {
                        None => When::Always,
                        Some(ExprKind::Call(name, args))
                            if name == "session_ends" && args.is_empty() =>
                        {
                            When::SessionEnds(true)
                        }
                        Some(ExprKind::Unary(UnOp::Not, inner)) if matches!(&inner.kind, ExprKind::Call(name, args) if name == "session_ends" && args.is_empty()) => {
                            When::SessionEnds(false)
                        }
                        Some(_) => match self.expr(when.as_ref().unwrap(), cx, false) {
                            Some(c) => When::Expr(c),
                            None => continue,
                        },
                    };
                    out.add.push(Add { parts: ps, when });
                }
            }
        }
        Some(out)
    }

    /// Gives `status` to the operations of a unit's blocks (not of nested
    /// units, which have their own) that name none.
    fn default_status(&mut self, block: BlockId, status: u16) {
        let mut cases = Vec::new();
        for op in &mut self.blocks[block as usize] {
            op.status.get_or_insert(status);
            if let OpKind::Switch {
                cases: c, default, ..
            } = &op.kind
            {
                cases.extend(c.iter().map(|(_, b)| *b));
                cases.extend(*default);
            }
        }
        for b in cases {
            self.default_status(b, status);
        }
    }

    /// Notes the unit's fields that can be read in place, and gives the
    /// unit a slot, set first, for where it begins.
    fn mark_fixed(&mut self, block: BlockId, cx: &mut UnitCx) -> Option<FixedRun> {
        let (fixed, len) =
            crate::in_place::leading_fixed(&self.blocks[block as usize], &self.blocks);
        if fixed.is_empty() || cx.next_slot >= u16::MAX as u32 {
            return None;
        }
        let start = self.alloc(cx, 1);
        for (slot, offset, kind) in fixed {
            let field = cx
                .fields
                .iter_mut()
                .find(|f| f.slot == slot && matches!(f.kind, FieldKind::Int | FieldKind::Bytes));
            if let Some(f) = field {
                f.fixed = Some(Fixed {
                    start,
                    offset,
                    kind,
                });
            }
        }
        let mark = Op {
            kind: OpKind::Mark,
            field: Arc::from("(start)"),
            slot: Some(start),
            requires: None,
            status: None,
            stream: false,
            forbid: None,
        };
        self.blocks[block as usize].insert(0, mark);
        Some(FixedRun { start, len })
    }

    fn alloc(&mut self, cx: &mut UnitCx, n: u32) -> u16 {
        let s = cx.next_slot;
        cx.next_slot += n;
        s.min(u16::MAX as u32) as u16
    }

    fn block(&mut self, items: &[Item], cx: &mut UnitCx) -> BlockId {
        let id = self.blocks.len() as BlockId;
        self.blocks.push(Vec::new());
        let mut ops = Vec::new();
        for item in items {
            if let Some(op) = self.item(item, cx, &mut ops) {
                ops.push(op);
            }
        }
        self.blocks[id as usize] = ops;
        id
    }

    /// Compiles one item; a variable with `&serialize` also pushes its
    /// parse operation to `ops` before returning the serialise one.
    fn item(&mut self, item: &Item, cx: &mut UnitCx, ops: &mut Vec<Op>) -> Option<Op> {
        match item {
            Item::Field(f) => self.field(f, cx),
            Item::Var(v) => {
                let expr = self.expr(&v.parse, cx, false);
                let kind = match v.ty {
                    FieldType::Bytes | FieldType::String => FieldKind::Bytes,
                    _ => FieldKind::Int,
                };
                // Like fields, alternatives of a switch may each compute the
                // same variable (`noreply` of several commands), or a
                // variable standing for another case's field: one slot.
                let shared = (cx.case_depth > 0 && cx.case_names.contains(&v.name))
                    .then(|| cx.visible.get(&v.name))
                    .flatten()
                    .filter(|x| x.kind == kind)
                    .map(|x| x.slot);
                let slot = match shared {
                    Some(s) => s,
                    None => {
                        let s = self.alloc(cx, 1);
                        self.declare(cx, &v.name, s, kind, v.span);
                        if cx.case_depth > 0 {
                            cx.case_names.push(v.name.clone());
                        }
                        s
                    }
                };
                let requires = match &v.requires {
                    Some(r) => Some(self.expr(r, cx, true)?),
                    None => None,
                };
                let mut op = Op {
                    kind: OpKind::Var(expr?),
                    field: Arc::from(v.name.as_str()),
                    slot: Some(slot),
                    requires,
                    status: None,
                    stream: false,
                    forbid: None,
                };
                if let Some((target, e)) = &v.serialize {
                    let Some(t) = cx.visible.get(target).map(|t| t.slot) else {
                        self.diags.push(Diagnostic::error(
                            "W0104",
                            format!("`&serialize` sets `{target}`, which is not an earlier field"),
                            e.span,
                        ));
                        return Some(op);
                    };
                    if let Some(expr) = self.expr(e, cx, true) {
                        // Parsing runs the `Var`; serialising runs this one.
                        ops.push(op.clone());
                        op = Op {
                            kind: OpKind::SerializeVar {
                                var: slot,
                                target: t,
                                expr,
                            },
                            field: op.field.clone(),
                            slot: None,
                            requires: None,
                            status: None,
                            stream: false,
                            forbid: None,
                        };
                    }
                }
                Some(op)
            }
            Item::Switch(s) => {
                let on = self.expr(&s.on, cx, false);
                let mut cases = Vec::new();
                let mut default = None;
                for case in &s.cases {
                    cx.case_depth += 1;
                    let block = self.block(&case.items, cx);
                    cx.case_depth -= 1;
                    if case.values.is_empty() {
                        default = Some(block);
                    }
                    for v in &case.values {
                        if let Some(e) = self.expr(v, cx, false) {
                            cases.push((e, block));
                        }
                    }
                }
                Some(Op {
                    kind: OpKind::Switch {
                        on: on?,
                        cases,
                        default,
                    },
                    field: Arc::from("switch"),
                    slot: None,
                    requires: None,
                    status: None,
                    stream: false,
                    forbid: None,
                })
            }
        }
    }

    fn declare(&mut self, cx: &mut UnitCx, name: &str, slot: u16, kind: FieldKind, span: Span) {
        self.declare_list(cx, name, slot, kind, span, 0);
    }

    fn declare_list(
        &mut self,
        cx: &mut UnitCx,
        name: &str,
        slot: u16,
        kind: FieldKind,
        span: Span,
        elem_slots: u16,
    ) {
        if cx.fields.iter().any(|f| f.name == name) {
            self.diags.push(Diagnostic::error(
                "W0101",
                format!("`{name}` is declared twice in this unit"),
                span,
            ));
        }
        cx.visible.insert(
            name.to_string(),
            Visible {
                slot,
                kind: kind.clone(),
                elem_slots,
            },
        );
        cx.fields.push(FieldInfo {
            name: name.to_string(),
            slot,
            kind,
            max_bytes: None,
            fixed: None,
        });
    }

    fn attr<'f>(&mut self, f: &'f Field, name: &str) -> Option<&'f Attr> {
        f.attrs.iter().find(|a| a.name == name)
    }

    fn const_attr(&mut self, f: &Field, name: &str) -> Option<u64> {
        let a = self.attr(f, name)?;
        match a.value.as_ref().map(|v| &v.kind) {
            Some(ExprKind::Int(n)) => Some(*n),
            _ => {
                self.diags.push(Diagnostic::error(
                    "W0105",
                    format!("`&{name}` takes a number"),
                    a.span,
                ));
                None
            }
        }
    }

    fn bytes_attr(&mut self, f: &Field, name: &str) -> Option<Arc<[u8]>> {
        let a = self.attr(f, name)?;
        match a.value.as_ref().map(|v| &v.kind) {
            Some(ExprKind::Str(s)) if !s.is_empty() => Some(Arc::from(s.as_slice())),
            _ => {
                self.diags.push(Diagnostic::error(
                    "W0105",
                    format!("`&{name}` takes a non-empty string"),
                    a.span,
                ));
                None
            }
        }
    }

    fn check_attrs(&mut self, f: &Field, allowed: &[&str]) {
        for a in &f.attrs {
            if !allowed.contains(&a.name.as_str()) {
                let what = field_type_name(&f.ty);
                self.diags.push(
                    Diagnostic::error(
                        "W0106",
                        format!("`&{}` is not an attribute of {what}", a.name),
                        a.span,
                    )
                    .hint(if allowed.is_empty() {
                        format!("{what} takes no attributes")
                    } else {
                        format!("{what} takes &{}", allowed.join(", &"))
                    }),
                );
            }
        }
    }

    fn field(&mut self, f: &Field, cx: &mut UnitCx) -> Option<Op> {
        let name: Arc<str> = Arc::from(f.name.as_deref().unwrap_or("_"));
        let status = self.const_attr(f, "error").map(|s| s as u16);
        let order = match self.attr(f, "byteorder").and_then(|a| a.value.clone()) {
            Some(Expr {
                kind: ExprKind::Str(s),
                ..
            }) if s == b"little" => ByteOrder::Little,
            Some(Expr {
                kind: ExprKind::Str(s),
                ..
            }) if s == b"big" => ByteOrder::Big,
            _ => cx.order,
        };
        let (kind, fkind, nslots, elem) = match &f.ty {
            FieldType::List(elem) => {
                self.check_attrs(
                    f,
                    &[
                        "count",
                        "until",
                        "until_elem",
                        "until_also",
                        "sep",
                        "max",
                        "max_bytes",
                        "error",
                        "length",
                        "ascii",
                        "hex",
                        "stream",
                    ],
                );
                let max = self
                    .const_attr(f, "max")
                    .map_or(DEFAULT_LIST_MAX, |m| m as u32);
                let max_bytes = self
                    .const_attr(f, "max_bytes")
                    .map(|m| m.min(u32::MAX as u64) as u32);
                // A streamed list keeps one element's values at a time.
                let stored = if self.attr(f, "stream").is_some() {
                    1
                } else {
                    max
                };
                let (elem, elem_slots, elem_unit) = match elem.as_ref() {
                    FieldType::Named(n) => match self.unit_by_name(n, f.span) {
                        Some(u) => {
                            let info = self.units[u].as_ref().unwrap();
                            (
                                Elem::Unit {
                                    block: info.block,
                                    slots: info.slots,
                                },
                                info.slots,
                                Some(u),
                            )
                        }
                        None => return None,
                    },
                    other => {
                        let s = self.scalar(other, f, cx, order, true)?;
                        (Elem::Scalar(Box::new(s)), 1, None)
                    }
                };
                let stop = if let Some(a) = self.attr(f, "count") {
                    let e = a.value.clone()?;
                    Stop::Count(self.expr(&e, cx, false)?)
                } else if self.attr(f, "until").is_some() && self.attr(f, "until_also").is_some() {
                    Stop::UntilEither(
                        self.bytes_attr(f, "until")?,
                        self.bytes_attr(f, "until_also")?,
                    )
                } else if self.attr(f, "until").is_some() {
                    Stop::Until(self.bytes_attr(f, "until")?)
                } else if let Some(a) = self.attr(f, "until_elem") {
                    let e = a.value.clone()?;
                    let mut elem_cx = UnitCx {
                        case_depth: 0,
                        case_names: Vec::new(),
                        order,
                        next_slot: 0,
                        visible: elem_unit
                            .map(|u| self.scopes[u].clone())
                            .unwrap_or_default(),
                        fields: Vec::new(),
                    };
                    Stop::UntilElem(self.expr(&e, &mut elem_cx, true)?)
                } else {
                    self.diags.push(
                        Diagnostic::error("W0107", format!("list `{name}` has no end"), f.span)
                            .hint("end a list with &count = EXPR, &until = \"TERMINATOR\" or &until_elem = EXPR"),
                    );
                    return None;
                };
                let sep = if self.attr(f, "sep").is_some() {
                    self.bytes_attr(f, "sep")
                } else {
                    None
                };
                let total = 1 + stored as u64 * elem_slots as u64;
                let total = total.min(u32::MAX as u64) as u32;
                (
                    OpKind::List {
                        elem,
                        stop,
                        sep,
                        max,
                        max_bytes,
                    },
                    FieldKind::List {
                        elem_unit,
                        elem_slots,
                    },
                    total,
                    (elem_slots, elem_unit),
                )
            }
            FieldType::Named(n) => {
                self.check_attrs(f, &["error"]);
                let u = self.unit_by_name(n, f.span)?;
                let info = self.units[u].as_ref().unwrap().clone();
                (
                    OpKind::Unit { block: info.block },
                    FieldKind::Unit(u),
                    info.slots as u32,
                    (0, None),
                )
            }
            other => {
                let s = self.scalar(other, f, cx, order, false)?;
                let fk = match s {
                    Scalar::Int { .. } | Scalar::AsciiInt { .. } | Scalar::VInt => FieldKind::Int,
                    _ => FieldKind::Bytes,
                };
                (OpKind::Scalar(s), fk, 1, (0, None))
            }
        };
        // Alternatives of a switch may each declare the same scalar field
        // (`flags` for several opcodes): they share its slot.
        let shared = f
            .name
            .as_ref()
            .filter(|n| cx.case_depth > 0 && cx.case_names.contains(n));
        let shared = shared
            .and_then(|n| cx.visible.get(n))
            .filter(|v| v.kind == fkind && nslots == 1)
            .map(|v| v.slot);
        let slot = match shared {
            Some(s) => s,
            None => self.alloc(cx, nslots),
        };
        let requires = match self.attr(f, "requires").and_then(|a| a.value.clone()) {
            Some(e) => Some(self.expr(&e, cx, true)?),
            None => None,
        };
        if let (Some(n), None) = (&f.name, shared) {
            self.declare_list(cx, n, slot, fkind, f.span, elem.0);
            cx.fields.last_mut().expect("just declared").max_bytes = match &kind {
                OpKind::Scalar(Scalar::Int { bytes, .. }) => Some(*bytes as u64),
                OpKind::Scalar(Scalar::Bytes { max, .. }) => Some(*max as u64),
                OpKind::Scalar(Scalar::AsciiInt { .. } | Scalar::VInt) => Some(8),
                _ => None,
            };
            if cx.case_depth > 0 {
                cx.case_names.push(n.clone());
            }
        }
        Some(Op {
            kind,
            field: name,
            slot: Some(slot),
            requires,
            status,
            stream: self.attr(f, "stream").is_some(),
            forbid: if self.attr(f, "forbid").is_some() {
                self.bytes_attr(f, "forbid")
            } else {
                None
            },
        })
    }

    fn unit_by_name(&mut self, n: &str, span: Span) -> Option<UnitId> {
        match self.unit_ids.get(n).copied() {
            Some(u) => {
                self.unit(u)?;
                Some(u)
            }
            None => {
                let d = if self.file.enums.iter().any(|e| e.name == n) {
                    Diagnostic::error("W0108", format!("`{n}` is an enumeration, not a unit"), span)
                        .hint("read the value as an integer (`uint8`) and compare it with `Enum::Variant`")
                } else {
                    Diagnostic::error("W0108", format!("unknown type `{n}`"), span)
                        .hint("types are uint8..uint64, int8..int64, bytes, string, vint, ws, a literal string, or a unit of this grammar")
                };
                self.diags.push(d);
                None
            }
        }
    }

    fn scalar(
        &mut self,
        ty: &FieldType,
        f: &Field,
        cx: &mut UnitCx,
        order: ByteOrder,
        in_list: bool,
    ) -> Option<Scalar> {
        let list_attrs: &[&str] = if in_list {
            &["count", "until", "until_elem", "sep", "max", "error"]
        } else {
            &[]
        };
        let with = |own: &[&'static str]| -> Vec<&'static str> {
            own.iter()
                .copied()
                .chain(list_attrs.iter().copied())
                .chain(["requires", "error"])
                .collect()
        };
        match ty {
            FieldType::Int { bytes, signed } => {
                let ascii = self.attr(f, "ascii").is_some() || self.attr(f, "hex").is_some();
                if ascii {
                    self.check_attrs(f, &with(&["ascii", "hex", "until", "before_any"]));
                    let before = !in_list && self.attr(f, "before_any").is_some();
                    let until = if in_list {
                        if self.attr(f, "sep").is_none() {
                            self.diags.push(
                                Diagnostic::error(
                                    "W0107",
                                    "a list of ASCII integers needs `&sep`",
                                    f.span,
                                )
                                .hint("say what separates the numbers, e.g. &sep = \" \""),
                            );
                            return None;
                        }
                        self.bytes_attr(f, "sep")?
                    } else if before {
                        self.bytes_attr(f, "before_any")?
                    } else {
                        match self.attr(f, "until") {
                            Some(_) => self.bytes_attr(f, "until")?,
                            None => {
                                self.diags.push(
                                    Diagnostic::error(
                                        "W0107",
                                        "an ASCII integer needs `&until`",
                                        f.span,
                                    )
                                    .hint("say what ends the digits, e.g. &until = \"\\r\\n\" or &before_any = \" \\r\""),
                                );
                                return None;
                            }
                        }
                    };
                    return Some(Scalar::AsciiInt {
                        until,
                        hex: self.attr(f, "hex").is_some(),
                        before,
                        signed: *signed,
                        bytes: *bytes,
                    });
                }
                self.check_attrs(f, &with(&["byteorder"]));
                Some(Scalar::Int {
                    bytes: *bytes,
                    signed: *signed,
                    order,
                })
            }
            FieldType::Bytes | FieldType::String => {
                self.check_attrs(
                    f,
                    &with(&[
                        "length",
                        "until",
                        "before_any",
                        "before_also",
                        "while_any",
                        "max",
                        "stream",
                        "eof",
                        "forbid",
                    ]),
                );
                let max = if in_list {
                    DEFAULT_BYTES_MAX
                } else {
                    self.const_attr(f, "max")
                        .map_or(DEFAULT_BYTES_MAX, |m| m.min(u32::MAX as u64) as u32)
                };
                let len = if let Some(a) = self.attr(f, "length") {
                    let e = a.value.clone()?;
                    Len::Expr(self.expr(&e, cx, false)?)
                } else if in_list && self.attr(f, "sep").is_some() {
                    Len::Until(self.bytes_attr(f, "sep")?)
                } else if !in_list && self.attr(f, "until").is_some() {
                    Len::Until(self.bytes_attr(f, "until")?)
                } else if !in_list && self.attr(f, "before_any").is_some() {
                    let also = match self.attr(f, "before_also") {
                        Some(_) => self.bytes_attr(f, "before_also")?,
                        None => Arc::from(&b""[..]),
                    };
                    Len::BeforeAny(self.bytes_attr(f, "before_any")?, also)
                } else if !in_list && self.attr(f, "while_any").is_some() {
                    Len::WhileAny(self.bytes_attr(f, "while_any")?)
                } else if !in_list && self.attr(f, "eof").is_some() {
                    if self.attr(f, "stream").is_none() {
                        self.diags.push(
                            Diagnostic::error(
                                "W0107",
                                "a field to the end of the stream must be `&stream`",
                                f.span,
                            )
                            .hint(
                                "its length is unbounded: add &stream so it is passed on in pieces",
                            ),
                        );
                        return None;
                    }
                    Len::Eof
                } else {
                    self.diags.push(
                        Diagnostic::error(
                            "W0107",
                            format!("`{}` has no length", f.name.as_deref().unwrap_or("_")),
                            f.span,
                        )
                        .hint("give it &length = EXPR, &until = \"DELIMITER\" or &before_any = \"BYTES\""),
                    );
                    return None;
                };
                if self.attr(f, "stream").is_some() && !matches!(len, Len::Expr(_) | Len::Eof) {
                    self.diags.push(
                        Diagnostic::error("W0107", "only a field of known length, or `&eof`, can be `&stream`", f.span)
                            .hint("a delimited field must be whole before its end is known; give it &length"),
                    );
                    return None;
                }
                // A constant length is its own maximum.
                let max = match &len {
                    Len::Expr(CExpr::Int(n)) if *n >= 0 => {
                        max.min((*n).min(u32::MAX as i128) as u32)
                    }
                    _ => max,
                };
                Some(Scalar::Bytes { len, max })
            }
            FieldType::VInt => {
                self.check_attrs(f, &with(&[]));
                Some(Scalar::VInt)
            }
            FieldType::Literal(s) => {
                self.check_attrs(f, &with(&["nocase"]));
                if s.is_empty() {
                    self.diags.push(Diagnostic::error(
                        "W0105",
                        "an empty literal matches nothing",
                        f.span,
                    ));
                    return None;
                }
                Some(Scalar::Literal {
                    bytes: Arc::from(s.as_slice()),
                    nocase: self.attr(f, "nocase").is_some(),
                })
            }
            FieldType::Ws => {
                self.check_attrs(f, &with(&[]));
                Some(Scalar::Ws)
            }
            FieldType::Named(_) | FieldType::List(_) => {
                self.diags.push(Diagnostic::error(
                    "W0108",
                    "lists of lists are not supported",
                    f.span,
                ));
                None
            }
        }
    }

    /// Compiles an expression. `dollar` allows `$$`.
    fn expr(&mut self, e: &Expr, cx: &mut UnitCx, dollar: bool) -> Option<CExpr> {
        Some(match &e.kind {
            ExprKind::Int(v) => CExpr::Int(*v as i128),
            ExprKind::Str(s) => CExpr::Str(Arc::from(s.as_slice())),
            ExprKind::SelfField(path) => self.path(path, &cx.visible, e.span)?,
            ExprKind::Dollar(path) => {
                if !dollar {
                    self.diags.push(Diagnostic::error(
                        "W0109",
                        "`$$` means the value being checked; it is not defined here",
                        e.span,
                    ));
                    return None;
                }
                match path.as_slice() {
                    [] => CExpr::Dollar,
                    [field] => match cx.visible.get(field) {
                        Some(v) => CExpr::DollarField(v.slot),
                        None => {
                            self.diags.push(Diagnostic::error(
                                "W0110",
                                format!("the list element has no field `{field}`"),
                                e.span,
                            ));
                            return None;
                        }
                    },
                    _ => {
                        self.diags.push(Diagnostic::error(
                            "W0110",
                            "`$$` paths have one field",
                            e.span,
                        ));
                        return None;
                    }
                }
            }
            ExprKind::EnumConst(en, v) => {
                let value = self
                    .file
                    .enums
                    .iter()
                    .find(|x| &x.name == en)
                    .and_then(|x| x.variants.iter().find(|(n, _)| n == v))
                    .map(|(_, n)| *n);
                match value {
                    Some(n) => CExpr::Int(n as i128),
                    None => {
                        self.diags.push(Diagnostic::error(
                            "W0111",
                            format!("unknown enumeration value `{en}::{v}`"),
                            e.span,
                        ));
                        return None;
                    }
                }
            }
            ExprKind::Unary(op, x) => CExpr::Unary(*op, Box::new(self.expr(x, cx, dollar)?)),
            ExprKind::Binary(op, a, b) => {
                let a = self.expr(a, cx, dollar);
                let b = self.expr(b, cx, dollar);
                CExpr::Binary(*op, Box::new(a?), Box::new(b?))
            }
            ExprKind::Call(name, args) => self.call(name, args, cx, dollar, e.span)?,
        })
    }

    fn call(
        &mut self,
        name: &str,
        args: &[Expr],
        cx: &mut UnitCx,
        dollar: bool,
        span: Span,
    ) -> Option<CExpr> {
        let (b, arity) = match name {
            "len" => (Builtin::Len, 1),
            "to_int" => (Builtin::ToInt, 1),
            "hex_to_int" => (Builtin::HexToInt, 1),
            "eq_nocase" => (Builtin::EqNocase, 2),
            "last_token_nocase" => (Builtin::LastTokenNocase, 2),
            "lookup" => (Builtin::Lookup, 4),
            "count" => (Builtin::Count, 3),
            "all_same" => (Builtin::AllSame, 4),
            "ends_with_ws" => (Builtin::EndsWithWs, 1),
            "starts_with_ws" => (Builtin::StartsWithWs, 1),
            "is_dec" => (Builtin::IsDec, 1),
            "is_hex" => (Builtin::IsHex, 1),
            "present" => (Builtin::Present, 1),
            "is_token" => (Builtin::IsToken, 1),
            "has_token_nocase" => (Builtin::HasTokenNocase, 2),
            "before" => (Builtin::Before, 2),
            "after" => (Builtin::After, 2),
            "trim" => (Builtin::Trim, 1),
            "c_number" => (Builtin::CNumber, 1),
            "prefix" => (Builtin::Prefix, 2),
            "only" => (Builtin::Only, 2),
            "pct_encoded" => (Builtin::PctEncoded, 1),
            "elem" => (Builtin::Elem, 3),
            "reply_context" => (Builtin::ReplyContext, 0),
            "choose" => (Builtin::Choose, 3),
            "limit" => return self.limit(args, span),
            "streamed" => (Builtin::Streamed, 0),
            _ => {
                self.diags.push(Diagnostic::error("W0112", format!("unknown function `{name}`"), span).hint(
                    "the functions are len, to_int, hex_to_int, eq_nocase, last_token_nocase, has_token_nocase, before, after, trim, c_number, prefix, only, pct_encoded, lookup, count, all_same, ends_with_ws, starts_with_ws, is_dec, is_hex, is_token, present, elem, reply_context, choose, limit, streamed",
                ));
                return None;
            }
        };
        if args.len() != arity {
            self.diags.push(Diagnostic::error(
                "W0112",
                format!("`{name}` takes {arity} arguments, not {}", args.len()),
                span,
            ));
            return None;
        }
        let mut out = Vec::new();
        // `lookup`, `count` and `all_same` name element fields by string.
        let elem_scope = match b {
            Builtin::Lookup | Builtin::Count | Builtin::AllSame | Builtin::Elem => {
                let list = match &args[0].kind {
                    ExprKind::SelfField(p) if p.len() == 1 => cx.visible.get(&p[0]).cloned(),
                    _ => None,
                };
                match list {
                    Some(Visible {
                        kind:
                            FieldKind::List {
                                elem_unit: Some(u), ..
                            },
                        ..
                    }) => Some(self.scopes[u].clone()),
                    _ => {
                        self.diags.push(Diagnostic::error(
                            "W0112",
                            format!("`{name}` searches a list of units, named `self.LIST`"),
                            args[0].span,
                        ));
                        return None;
                    }
                }
            }
            _ => None,
        };
        for (i, a) in args.iter().enumerate() {
            let field_arg = matches!(
                (b, i),
                (Builtin::Lookup, 1 | 3)
                    | (Builtin::Count, 1)
                    | (Builtin::AllSame, 1 | 3)
                    | (Builtin::Elem, 2)
            );
            if (b, i) == (Builtin::Only, 1) {
                // The class, compiled once to its map.
                let class = match &a.kind {
                    ExprKind::Str(s) if !s.is_empty() => crate::eval::char_class(s),
                    _ => None,
                };
                match class {
                    Some(map) => out.push(CExpr::Str(Arc::from(&map[..]))),
                    None => {
                        self.diags.push(
                            Diagnostic::error(
                                "W0112",
                                "`only` takes a class of bytes as a non-empty string",
                                a.span,
                            )
                            .hint("e.g. only($$, \"0-9A-Fa-f\"), or \"^\\x00-\\x1f\" for any byte but those; a range's end is not below its start"),
                        );
                        return None;
                    }
                }
            } else if field_arg {
                let scope = elem_scope.as_ref().unwrap();
                match &a.kind {
                    ExprKind::Str(s) => match scope.get(std::str::from_utf8(s).unwrap_or("")) {
                        Some(v) => out.push(CExpr::ElemField(v.slot)),
                        None => {
                            self.diags.push(Diagnostic::error(
                                "W0110",
                                format!(
                                    "the list's elements have no field `{}`",
                                    String::from_utf8_lossy(s)
                                ),
                                a.span,
                            ));
                            return None;
                        }
                    },
                    _ => {
                        self.diags.push(Diagnostic::error(
                            "W0112",
                            "name the element field as a string",
                            a.span,
                        ));
                        return None;
                    }
                }
            } else {
                out.push(self.expr(a, cx, dollar)?);
            }
        }
        Some(CExpr::Call(b, out))
    }

    /// `limit("name", DEFAULT)`: a limit its user may set when the grammar
    /// loads, compiled to its index and default. Every use of a name gives
    /// the same default.
    fn limit(&mut self, args: &[Expr], span: Span) -> Option<CExpr> {
        let (name, default) = match args {
            [Expr {
                kind: ExprKind::Str(n),
                ..
            }, Expr {
                kind: ExprKind::Int(d),
                ..
            }] => (String::from_utf8_lossy(n).into_owned(), *d as i128),
            _ => {
                self.diags.push(
                    Diagnostic::error(
                        "W0112",
                        "`limit` takes a name and a default: limit(\"NAME\", INTEGER)",
                        span,
                    )
                    .hint("e.g. limit(\"max_body_bytes\", 1048576)"),
                );
                return None;
            }
        };
        let index = match self.limits.iter().position(|(n, _)| *n == name) {
            Some(i) if self.limits[i].1 != default => {
                self.diags.push(Diagnostic::error(
                    "W0112",
                    format!(
                        "limit `{name}` has the default {} elsewhere, not {default}",
                        self.limits[i].1
                    ),
                    span,
                ));
                return None;
            }
            Some(i) => i,
            None => {
                self.limits.push((name, default));
                self.limits.len() - 1
            }
        };
        Some(CExpr::Call(
            Builtin::Limit,
            vec![CExpr::Int(index as i128), CExpr::Int(default)],
        ))
    }

    fn path(
        &mut self,
        path: &[String],
        scope: &HashMap<String, Visible>,
        span: Span,
    ) -> Option<CExpr> {
        let Some(v) = scope.get(&path[0]) else {
            self.diags.push(
                Diagnostic::error("W0110", format!("`self.{}` is not an earlier field", path[0]), span)
                    .hint("an expression may use only fields declared before it: parsing reads them first"),
            );
            return None;
        };
        match (&v.kind, &path[1..]) {
            (FieldKind::List { .. }, []) => Some(CExpr::List(ListRef {
                slot: v.slot,
                elem_slots: v.elem_slots,
            })),
            (_, []) => Some(CExpr::Slot(v.slot)),
            (FieldKind::Unit(u), rest) => {
                let inner = self.scopes[*u].clone();
                match self.path(rest, &inner, span)? {
                    CExpr::Slot(s) => Some(CExpr::Slot(v.slot + s)),
                    CExpr::List(l) => Some(CExpr::List(ListRef {
                        slot: v.slot + l.slot,
                        elem_slots: l.elem_slots,
                    })),
                    _ => None,
                }
            }
            _ => {
                self.diags.push(Diagnostic::error(
                    "W0110",
                    format!("`{}` has no fields", path[0]),
                    span,
                ));
                None
            }
        }
    }
}

fn field_type_name(t: &FieldType) -> &'static str {
    match t {
        FieldType::Int { .. } => "an integer",
        FieldType::Bytes => "`bytes`",
        FieldType::String => "`string`",
        FieldType::VInt => "`vint`",
        FieldType::Literal(_) => "a literal",
        FieldType::Ws => "`ws`",
        FieldType::Named(_) => "a unit field",
        FieldType::List(_) => "a list",
    }
}
