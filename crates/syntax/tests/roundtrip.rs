//! Formatting is parse-stable: for every tree the parser can produce,
//! parsing the formatter's output gives back the same tree (spans aside),
//! and formatting that tree again gives back the same text.

use flick_span::Span;
use flick_syntax::ast::*;
use flick_syntax::{format_program, parse};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;

const D: Span = Span::DUMMY;

/// Words that never lex as an identifier, and the type names that the
/// parser turns into built-in types.
const RESERVED: &[&str] = &[
    "type", "proc", "fun", "grammar", "global", "local", "let", "if", "else", "on", "foldt",
    "ordering", "by", "as", "and", "or", "not", "mod", "True", "False", "None", "true", "false",
    "while", "for", "loop", "_", "integer", "string", "bytes", "bool", "ref", "list", "dict",
    "record",
];

/// Formats `p`, parses the text back and checks that nothing changed.
fn check_round_trip(mut p: Program) {
    let text = format_program(&p);
    let (mut q, diags) = parse(&text);
    assert!(diags.is_empty(), "formatted:\n{text}\n{diags:#?}");
    p.erase_spans();
    q.erase_spans();
    assert_eq!(q, p, "fmt changed the tree; formatted:\n{text}");
    assert_eq!(format_program(&q), text, "fmt is not a fixed point");
}

// ---- tree builders ----

fn id(name: &str) -> Ident {
    Ident::new(name, D)
}

fn ex(kind: ExprKind) -> Expr {
    Expr { kind, span: D }
}

fn var(name: &str) -> Expr {
    ex(ExprKind::Var(id(name)))
}

fn ty(kind: TypeKind, annotations: Vec<Annotation>) -> TypeExpr {
    TypeExpr {
        kind,
        annotations,
        span: D,
    }
}

fn st(kind: StmtKind) -> Stmt {
    Stmt { kind, span: D }
}

fn block(stmts: Vec<Stmt>) -> Block {
    Block { stmts, span: D }
}

fn if_stmt(cond: Expr, then: Block, otherwise: Option<Block>) -> Stmt {
    st(StmtKind::If {
        cond,
        then,
        otherwise,
    })
}

fn let_stmt(name: Ident, ty: Option<TypeExpr>, value: Expr) -> Stmt {
    st(StmtKind::Let { name, ty, value })
}

#[allow(clippy::too_many_arguments)]
fn foldt(
    channels: Expr,
    elem: Ident,
    left: Ident,
    right: Ident,
    order_field: Ident,
    key: Ident,
    body: Block,
) -> Expr {
    ex(ExprKind::Foldt(Box::new(Foldt {
        channels,
        elem,
        left,
        right,
        order_field,
        key,
        body,
    })))
}

fn fun(name: &str, params: Vec<Param>, results: Vec<TypeExpr>, body: Vec<Stmt>) -> Decl {
    Decl::Fun(FunDecl {
        name: id(name),
        params,
        results,
        body: block(body),
        span: D,
    })
}

// ---- strategies ----

fn ident() -> impl Strategy<Value = Ident> + Clone {
    "[a-zA-Z_][a-zA-Z0-9_]{0,5}"
        .prop_filter("a keyword, a type name or `_`", |s| {
            !RESERVED.contains(&s.as_str())
        })
        .prop_map(|s| Ident::new(s, D))
}

fn binop() -> impl Strategy<Value = BinOp> + Clone {
    select(vec![
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::Div,
        BinOp::Mod,
        BinOp::Eq,
        BinOp::Ne,
        BinOp::Lt,
        BinOp::Le,
        BinOp::Gt,
        BinOp::Ge,
        BinOp::And,
        BinOp::Or,
    ])
}

/// An integer literal as the lexer leaves it: its value, whether it is
/// hexadecimal, and its text where that is not the canonical one (leading
/// zeros, `_` between digits, capital hexadecimal digits).
fn int_parts(
    value: impl Strategy<Value = u64> + Clone,
) -> impl Strategy<Value = (u64, bool, Option<Box<str>>)> + Clone {
    (value, any::<bool>()).prop_flat_map(|(value, hex)| {
        let written = (0usize..3, vec(any::<bool>(), 24), any::<bool>()).prop_map(
            move |(zeros, separators, upper)| {
                let digits = if hex {
                    format!("{value:x}")
                } else {
                    value.to_string()
                };
                let digits = "0".repeat(zeros) + &digits;
                let mut body = String::new();
                for (i, d) in digits.chars().enumerate() {
                    if i > 0 && separators.get(i).copied().unwrap_or(false) {
                        body.push('_');
                    }
                    body.push(if upper { d.to_ascii_uppercase() } else { d });
                }
                let text = if hex { format!("0x{body}") } else { body };
                int_spelling(&text, value, hex)
            },
        );
        let spelling = prop_oneof![2 => Just(None), 1 => written];
        (Just(value), Just(hex), spelling)
    })
}

fn int() -> impl Strategy<Value = Expr> + Clone {
    let value = prop_oneof![0u64..300, any::<u64>()];
    int_parts(value).prop_map(|(value, hex, spelling)| {
        ex(ExprKind::Int {
            value,
            hex,
            spelling,
        })
    })
}

fn string_literal() -> impl Strategy<Value = String> + Clone {
    let c = prop_oneof![
        4 => proptest::char::range('a', 'z'),
        2 => select(vec![
            '"', '\\', '\n', '\r', '\t', '\0', '\x01', '\x1b', '\x1f', '\x7f', ' ', '#', '(', '{',
            '\'', 'é', '\u{80}', '\u{2028}', '😀',
        ]),
        1 => any::<char>(),
    ];
    vec(c, 0..8).prop_map(|cs| cs.into_iter().collect())
}

/// Every expression but `foldt`, which only a whole line can hold.
fn expr() -> BoxedStrategy<Expr> {
    let leaf = prop_oneof![
        1 => int(),
        1 => string_literal().prop_map(|s| ex(ExprKind::Str(s))),
        1 => any::<bool>().prop_map(|b| ex(ExprKind::Bool(b))),
        1 => Just(ex(ExprKind::None)),
        1 => Just(ex(ExprKind::Anonymous)),
        2 => ident().prop_map(|i| ex(ExprKind::Var(i))),
    ];
    leaf.prop_recursive(3, 24, 3, |inner| {
        let field = prop_oneof![1 => Just(id("_")), 3 => ident()];
        let items = vec(inner.clone(), 0..3);
        let tuple = prop_oneof![Just(Vec::new()), vec(inner.clone(), 2..4)];
        prop_oneof![
            2 => (select(vec![UnOp::Neg, UnOp::Not]), inner.clone())
                .prop_map(|(op, x)| ex(ExprKind::Unary(op, Box::new(x)))),
            4 => (binop(), inner.clone(), inner.clone())
                .prop_map(|(op, l, r)| ex(ExprKind::Binary(op, Box::new(l), Box::new(r)))),
            1 => (inner.clone(), field).prop_map(|(x, f)| ex(ExprKind::Field(Box::new(x), f))),
            1 => (inner.clone(), inner.clone())
                .prop_map(|(x, i)| ex(ExprKind::Index(Box::new(x), Box::new(i)))),
            1 => (ident(), items.clone()).prop_map(|(f, args)| ex(ExprKind::Call(f, args))),
            1 => tuple.prop_map(|es| ex(ExprKind::Tuple(es))),
            1 => items.prop_map(|es| ex(ExprKind::List(es))),
        ]
    })
    .boxed()
}

fn annotation_value() -> BoxedStrategy<Expr> {
    let leaf = prop_oneof![
        int(),
        any::<bool>().prop_map(|b| ex(ExprKind::Bool(b))),
        ident().prop_map(|i| ex(ExprKind::Var(i))),
    ];
    leaf.prop_recursive(2, 6, 2, |inner| {
        (binop(), inner.clone(), inner)
            .prop_map(|(op, l, r)| ex(ExprKind::Binary(op, Box::new(l), Box::new(r))))
    })
    .boxed()
}

fn annotations() -> impl Strategy<Value = Vec<Annotation>> + Clone {
    let annotation = (ident(), annotation_value()).prop_map(|(name, value)| Annotation {
        name,
        value,
        span: D,
    });
    prop_oneof![3 => Just(Vec::new()), 1 => vec(annotation, 1..3)]
}

fn type_expr() -> BoxedStrategy<TypeExpr> {
    let leaf_kind = prop_oneof![
        1 => Just(TypeKind::Integer),
        1 => Just(TypeKind::String),
        1 => Just(TypeKind::Bytes),
        1 => Just(TypeKind::Bool),
        2 => ident().prop_map(TypeKind::Named),
    ];
    let leaf = (leaf_kind, annotations()).prop_map(|(k, a)| ty(k, a));
    leaf.prop_recursive(3, 16, 3, |inner| {
        let side = option::of(inner.clone().prop_map(Box::new));
        let chan = (side.clone(), side).prop_map(|(input, output)| ChanType { input, output });
        let kind = prop_oneof![
            1 => inner.clone().prop_map(|t| TypeKind::List(Box::new(t))),
            1 => prop_oneof![Just(Vec::new()), vec(inner.clone(), 2..4)]
                .prop_map(TypeKind::Tuple),
            1 => (inner.clone(), inner.clone())
                .prop_map(|(k, v)| TypeKind::Dict(Box::new(k), Box::new(v))),
            1 => inner.prop_map(|t| TypeKind::Ref(Box::new(t))),
            2 => chan.clone().prop_map(TypeKind::Chan),
            1 => chan.prop_map(TypeKind::ChanArray),
        ];
        (kind, annotations()).prop_map(|(k, a)| ty(k, a))
    })
    .boxed()
}

fn stmt() -> BoxedStrategy<Stmt> {
    let leaf = prop_oneof![
        (ident(), option::of(type_expr()), expr()).prop_map(|(n, t, v)| let_stmt(n, t, v)),
        (expr(), expr()).prop_map(|(place, value)| st(StmtKind::Assign { place, value })),
        (expr(), expr()).prop_map(|(value, channel)| st(StmtKind::Send { value, channel })),
        expr().prop_map(|e| st(StmtKind::Expr(e))),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        let body = vec(inner, 1..3).prop_map(block).boxed();
        let foldt = (
            expr(),
            ident(),
            ident(),
            ident(),
            ident(),
            ident(),
            body.clone(),
        )
            .prop_map(|(c, e, l, r, f, k, b)| foldt(c, e, l, r, f, k, b));
        prop_oneof![
            (expr(), body.clone(), option::of(body.clone())).prop_map(|(c, t, o)| if_stmt(c, t, o)),
            // `else if`: the else branch is a single nested `if`.
            (expr(), body.clone(), expr(), body.clone(), option::of(body)).prop_map(
                |(c, t, c2, t2, o)| { if_stmt(c, t, Some(block(vec![if_stmt(c2, t2, o)]))) }
            ),
            (ident(), option::of(type_expr()), foldt.clone())
                .prop_map(|(n, t, v)| let_stmt(n, t, v)),
            foldt.prop_map(|f| st(StmtKind::Expr(f))),
        ]
    })
    .boxed()
}

fn body() -> impl Strategy<Value = Block> + Clone {
    vec(stmt(), 1..4).prop_map(block)
}

/// A function's body may be empty when its signature is on an indented
/// line of its own; every other block holds a statement.
fn fun_body() -> impl Strategy<Value = Block> + Clone {
    prop_oneof![1 => Just(block(Vec::new())), 6 => body()]
}

fn param() -> impl Strategy<Value = Param> + Clone {
    (ident(), type_expr()).prop_map(|(name, ty)| Param { name, ty, span: D })
}

fn proc_item() -> impl Strategy<Value = ProcItem> + Clone {
    prop_oneof![
        (
            select(vec![StateScope::Global, StateScope::Local]),
            ident(),
            option::of(type_expr()),
            expr()
        )
            .prop_map(|(scope, name, ty, init)| ProcItem::State(StateDecl {
                scope,
                name,
                ty,
                init,
                span: D,
            })),
        (expr(), vec(expr(), 1..4)).prop_map(|(source, steps)| ProcItem::Rule(Rule {
            source,
            steps,
            span: D,
        })),
        (expr(), body()).prop_map(|(cond, body)| ProcItem::Guarded(Guarded {
            cond,
            body,
            span: D,
        })),
        (
            prop_oneof![3 => Just(id("disconnect")), 1 => ident()],
            ident(),
            option::of(ident()),
            body()
        )
            .prop_map(|(event, channel, index, body)| ProcItem::Handler(Handler {
                event,
                channel,
                index,
                body,
                span: D,
            })),
    ]
}

fn decl() -> impl Strategy<Value = Decl> {
    let field =
        (option::of(ident()), type_expr()).prop_map(|(name, ty)| Field { name, ty, span: D });
    let type_body = prop_oneof![
        vec(field, 1..4).prop_map(TypeBody::Record),
        type_expr().prop_map(TypeBody::Alias),
    ];
    prop_oneof![
        1 => ident().prop_map(|name| Decl::Grammar(GrammarDecl { name, span: D })),
        1 => (ident(), type_body).prop_map(|(name, body)| Decl::Type(TypeDecl {
            name,
            body,
            span: D,
        })),
        2 => (ident(), vec(param(), 0..3), vec(proc_item(), 0..4)).prop_map(
            |(name, params, items)| Decl::Proc(ProcDecl {
                name,
                params,
                items,
                span: D,
            })
        ),
        2 => (ident(), vec(param(), 0..3), vec(type_expr(), 0..=2), fun_body()).prop_map(
            |(name, params, results, body)| Decl::Fun(FunDecl {
                name,
                params,
                results,
                body,
                span: D,
            })
        ),
    ]
}

fn m_operand() -> impl Strategy<Value = MOperand> {
    prop_oneof![
        int_parts(any::<u64>()).prop_map(|(value, hex, spelling)| MOperandKind::Int {
            value,
            hex,
            spelling
        }),
        any::<[u8; 4]>().prop_map(MOperandKind::Ipv4),
        ident().prop_map(MOperandKind::Name),
        (ident(), ident()).prop_map(|(a, b)| MOperandKind::Dotted(a, b)),
    ]
    .prop_map(|kind| MOperand { kind, span: D })
}

fn register_decl(init: bool) -> impl Strategy<Value = RegisterDecl> {
    let ty =
        prop_oneof![Just(TypeKind::Integer), ident().prop_map(TypeKind::Named)].prop_map(|kind| {
            TypeExpr {
                kind,
                annotations: vec![],
                span: D,
            }
        });
    let init = if init {
        option::of(m_operand()).boxed()
    } else {
        Just(None).boxed()
    };
    (ident(), option::of(ty), init).prop_map(|(name, ty, init)| RegisterDecl {
        name,
        ty,
        init,
        span: D,
    })
}

fn m_action() -> impl Strategy<Value = MAction> {
    let arith = select(vec![
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::Div,
        BinOp::Mod,
    ]);
    let value =
        prop_oneof![
            m_operand().prop_map(MExpr::Operand),
            (arith, m_operand(), m_operand()).prop_map(|(op, a, b)| MExpr::Binary(op, a, b, D)),
            (select(vec!["max", "min"]), m_operand(), m_operand())
                .prop_map(|(f, a, b)| MExpr::Call(id(f), a, b, D)),
        ];
    prop_oneof![
        (m_operand(), value).prop_map(|(target, value)| MAction::Update {
            target,
            value,
            span: D
        }),
        ident().prop_map(|i| MAction::Next(i, D)),
        ident().prop_map(|i| MAction::Forward(i, D)),
        Just(MAction::Drop(D)),
        (m_operand(), m_operand()).prop_map(|(field, value)| MAction::Set {
            field,
            value,
            span: D
        }),
        ident().prop_map(|i| MAction::Goto(i, D)),
    ]
}

fn stage_item() -> impl Strategy<Value = StageItem> {
    let unit = select(vec![TimeUnit::Us, TimeUnit::Ms, TimeUnit::S]);
    let duration = (any::<u64>(), unit).prop_map(|(amount, unit)| Duration {
        amount,
        unit,
        span: D,
    });
    let cmp = select(vec![
        BinOp::Eq,
        BinOp::Ne,
        BinOp::Lt,
        BinOp::Le,
        BinOp::Gt,
        BinOp::Ge,
    ]);
    let cond = prop_oneof![
        (m_operand(), cmp, m_operand()).prop_map(|(lhs, op, rhs)| MCond::Compare {
            lhs,
            op,
            rhs,
            span: D
        }),
        ident().prop_map(|i| MCond::From(i, D)),
    ];
    let transition = (
        option::of(ident()),
        ident(),
        vec(cond, 0..3),
        vec(m_action(), 1..4),
    )
        .prop_map(|(state, event, when, actions)| {
            StageItem::Transition(TransitionDecl {
                state,
                event,
                when,
                actions,
                span: D,
            })
        });
    prop_oneof![
        1 => (vec(m_operand(), 1..3), option::of(vec(m_operand(), 1..3))).prop_map(
            |(fields, other)| StageItem::Key {
                fields,
                other,
                span: D
            }
        ),
        1 => duration.clone().prop_map(StageItem::IdleTimeout),
        1 => duration.prop_map(StageItem::HardTimeout),
        1 => m_operand().prop_map(StageItem::Capacity),
        1 => ident().prop_map(StageItem::Evict),
        1 => register_decl(true).prop_map(StageItem::Flow),
        1 => vec(ident(), 1..3).prop_map(|s| StageItem::States(s, D)),
        3 => transition,
    ]
}

fn machine() -> impl Strategy<Value = MachineDecl> {
    let stage = (ident(), vec(stage_item(), 1..5)).prop_map(|(name, items)| {
        MachineItem::Stage(StageDecl {
            name,
            items,
            span: D,
        })
    });
    let item = prop_oneof![
        1 => (ident(), m_operand()).prop_map(|(name, value)| MachineItem::Const {
            name,
            value,
            span: D
        }),
        1 => register_decl(true).prop_map(MachineItem::Global),
        1 => register_decl(false).prop_map(MachineItem::Meta),
        2 => stage,
    ];
    (ident(), vec(param(), 0..3), vec(item, 0..4)).prop_map(|(name, channels, items)| MachineDecl {
        name,
        channels,
        items,
        span: D,
    })
}

fn program() -> impl Strategy<Value = Program> {
    (vec(decl(), 0..4), vec(machine(), 0..2))
        .prop_map(|(decls, machines)| Program { decls, machines })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn formatting_is_parse_stable(p in program()) {
        check_round_trip(p);
    }
}

// ---- regressions found by the property ----

fn foldt_stmt() -> Stmt {
    st(StmtKind::Expr(foldt(
        var("cs"),
        id("e"),
        id("a"),
        id("b"),
        id("f"),
        id("k"),
        block(vec![st(StmtKind::Expr(var("a")))]),
    )))
}

/// A line after a `foldt` that starts with `[` is a new statement, not an
/// index into the fold.
#[test]
fn foldt_then_list_statement() {
    let list = ex(ExprKind::List(vec![var("x")]));
    let p = Program {
        decls: vec![fun(
            "f",
            vec![],
            vec![],
            vec![foldt_stmt(), st(StmtKind::Expr(list))],
        )],
        machines: Vec::new(),
    };
    check_round_trip(p);
}

/// A line after a `foldt` that starts with `-` is a new statement, not a
/// subtraction from the fold.
#[test]
fn foldt_then_negation_statement() {
    let neg = ex(ExprKind::Unary(UnOp::Neg, Box::new(var("x"))));
    let p = Program {
        decls: vec![fun(
            "f",
            vec![],
            vec![],
            vec![foldt_stmt(), st(StmtKind::Expr(neg))],
        )],
        machines: Vec::new(),
    };
    check_round_trip(p);
}

/// `list<a/->` would lex `->` as an arrow.
#[test]
fn chan_with_unused_output_before_closing_angle() {
    let out_unused = || {
        ty(
            TypeKind::Chan(ChanType {
                input: Some(Box::new(ty(TypeKind::Integer, vec![]))),
                output: None,
            }),
            vec![],
        )
    };
    let list = ty(TypeKind::List(Box::new(out_unused())), vec![]);
    let dict = ty(
        TypeKind::Dict(Box::new(out_unused()), Box::new(out_unused())),
        vec![],
    );
    let p = Program {
        decls: vec![fun(
            "f",
            vec![Param {
                name: id("x"),
                ty: list,
                span: D,
            }],
            vec![dict],
            vec![st(StmtKind::Expr(var("x")))],
        )],
        machines: Vec::new(),
    };
    check_round_trip(p);
}

/// A process without rules and a function without statements parse only
/// with the signature on an indented line.
#[test]
fn empty_proc_and_fun() {
    let x = Param {
        name: id("x"),
        ty: ty(TypeKind::Integer, vec![]),
        span: D,
    };
    let p = Program {
        decls: vec![
            Decl::Proc(ProcDecl {
                name: id("p"),
                params: vec![x.clone()],
                items: vec![],
                span: D,
            }),
            fun("f", vec![x], vec![ty(TypeKind::Bool, vec![])], vec![]),
        ],
        machines: Vec::new(),
    };
    check_round_trip(p);
}
