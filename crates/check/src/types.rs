//! Checked types and the unifier behind `let` inference.

use std::fmt;

/// Index of a record in [`CheckedProgram::records`](crate::CheckedProgram).
pub type RecordId = usize;

/// A type after checking. Sizes and capacities are carried for the memory
/// bound; they never make two types incompatible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ty {
    Int {
        signed: bool,
        /// Width in bytes: 1, 2, 4 or 8.
        bytes: u8,
    },
    Bool,
    Str {
        max: u64,
    },
    Bytes {
        max: u64,
    },
    Record(RecordId, String),
    List(Box<Ty>, u64),
    /// The empty tuple is the unit type `()`.
    Tuple(Vec<Ty>),
    Dict(Box<Ty>, Box<Ty>, u64),
    Ref(Box<Ty>),
    Chan(ChanTy),
    ChanArray(ChanTy, u64),
    /// A packet program's token-bucket meter: `meter {rate=R, burst=B,
    /// excess=E}`, tokens a second, the committed and the excess bucket's
    /// depths (0 where not written: a parameter's type need not say; a
    /// state variable's must give `rate` and `burst`; no `excess` is a
    /// two-colour meter).
    Meter {
        rate: u64,
        burst: u64,
        excess: u64,
    },
    /// A packet program's Bloom filter: `bloom {bits=N, hashes=K}` (0
    /// where not written, as for [`Ty::Meter`]).
    Bloom {
        bits: u64,
        hashes: u64,
    },
    /// The type of the literal `None`: only compared with other values.
    None,
    /// An inference variable.
    Var(u32),
    /// Stands for an expression whose error was already reported.
    Error,
}

/// The readable (`input`) and writable (`output`) sides of a channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChanTy {
    pub input: Option<Box<Ty>>,
    pub output: Option<Box<Ty>>,
}

impl Ty {
    pub fn unit() -> Ty {
        Ty::Tuple(Vec::new())
    }

    pub fn int() -> Ty {
        Ty::Int {
            signed: true,
            bytes: 8,
        }
    }

    pub fn is_unit(&self) -> bool {
        matches!(self, Ty::Tuple(v) if v.is_empty())
    }

    /// The type behind any number of `ref`s.
    pub fn behind_refs(&self) -> &Ty {
        match self {
            Ty::Ref(t) => t.behind_refs(),
            t => t,
        }
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Int { .. } => f.write_str("integer"),
            Ty::Bool => f.write_str("bool"),
            Ty::Str { .. } => f.write_str("string"),
            Ty::Bytes { .. } => f.write_str("bytes"),
            Ty::Record(_, name) => f.write_str(name),
            Ty::List(t, _) => write!(f, "list<{t}>"),
            Ty::Tuple(ts) => {
                f.write_str("(")?;
                for (i, t) in ts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{t}")?;
                }
                f.write_str(")")
            }
            Ty::Dict(k, v, _) => write!(f, "dict<{k}*{v}>"),
            Ty::Ref(t) => write!(f, "ref {t}"),
            Ty::Chan(c) => write!(f, "{c}"),
            Ty::ChanArray(c, _) => write!(f, "[{c}]"),
            Ty::Meter { .. } => f.write_str("meter"),
            Ty::Bloom { .. } => f.write_str("bloom"),
            Ty::None => f.write_str("None"),
            Ty::Var(_) | Ty::Error => f.write_str("_"),
        }
    }
}

impl fmt::Display for ChanTy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.input {
            Some(t) => write!(f, "{t}")?,
            None => f.write_str("-")?,
        }
        f.write_str("/")?;
        match &self.output {
            Some(t) => write!(f, "{t}"),
            None => f.write_str("-"),
        }
    }
}

/// The built-in types of packet state and the annotations each takes:
/// `meter {rate=R, burst=B}` and `bloom {bits=N, hashes=K}`.
pub const OBJECT_TYPES: &[(&str, &[&str])] = &[
    ("meter", &["rate", "burst", "excess"]),
    ("bloom", &["bits", "hashes"]),
];

/// The annotations of built-in object type `name`, if it is one.
pub fn object_annotations(name: &str) -> Option<&'static [&'static str]> {
    OBJECT_TYPES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, a)| *a)
}

/// The bytes a meter keeps: the packet time its committed bucket is full
/// again, and the time its excess bucket then takes to fill.
pub const METER_BYTES: u64 = 16;

/// The most bits a Bloom filter has (512 MiB), and hashes per key.
pub const BLOOM_MAX_BITS: u64 = 1 << 32;
pub const BLOOM_MAX_HASHES: u64 = 16;

/// The bytes a Bloom filter of `bits` bits keeps: whole 64-bit words.
pub fn bloom_bytes(bits: u64) -> u64 {
    bits.div_ceil(64).saturating_mul(8)
}

/// Two types that cannot be made the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch;

/// Inference variables and their solutions.
#[derive(Debug, Default)]
pub struct Unifier {
    solutions: Vec<Option<Ty>>,
}

impl Unifier {
    pub fn fresh(&mut self) -> Ty {
        self.solutions.push(None);
        Ty::Var(self.solutions.len() as u32 - 1)
    }

    /// Follows solved variables at the top of `ty`.
    pub fn shallow(&self, ty: &Ty) -> Ty {
        let mut t = ty.clone();
        while let Ty::Var(v) = t {
            match &self.solutions[v as usize] {
                Some(s) => t = s.clone(),
                None => return t,
            }
        }
        t
    }

    /// Substitutes every solved variable in `ty`.
    pub fn resolve(&self, ty: &Ty) -> Ty {
        let map = |t: &Ty| Box::new(self.resolve(t));
        let chan = |c: &ChanTy| ChanTy {
            input: c.input.as_deref().map(map),
            output: c.output.as_deref().map(map),
        };
        match self.shallow(ty) {
            Ty::List(t, n) => Ty::List(map(&t), n),
            Ty::Tuple(ts) => Ty::Tuple(ts.iter().map(|t| self.resolve(t)).collect()),
            Ty::Dict(k, v, n) => Ty::Dict(map(&k), map(&v), n),
            Ty::Ref(t) => Ty::Ref(map(&t)),
            Ty::Chan(c) => Ty::Chan(chan(&c)),
            Ty::ChanArray(c, n) => Ty::ChanArray(chan(&c), n),
            t => t,
        }
    }

    fn occurs(&self, v: u32, ty: &Ty) -> bool {
        match self.shallow(ty) {
            Ty::Var(w) => v == w,
            Ty::List(t, _) | Ty::Ref(t) => self.occurs(v, &t),
            Ty::Dict(k, t, _) => self.occurs(v, &k) || self.occurs(v, &t),
            Ty::Tuple(ts) => ts.iter().any(|t| self.occurs(v, t)),
            _ => false,
        }
    }

    /// Makes `a` and `b` the same type, or fails. A `ref T` unifies with
    /// `T`: references are dereferenced wherever a value is used.
    pub fn unify(&mut self, a: &Ty, b: &Ty) -> Result<(), Mismatch> {
        let a = self.shallow(a);
        let b = self.shallow(b);
        match (&a, &b) {
            (Ty::Error, _) | (_, Ty::Error) => Ok(()),
            (Ty::Var(x), Ty::Var(y)) if x == y => Ok(()),
            (Ty::Var(x), t) | (t, Ty::Var(x)) => {
                if self.occurs(*x, t) {
                    return Err(Mismatch);
                }
                self.solutions[*x as usize] = Some(t.clone());
                Ok(())
            }
            (Ty::Ref(x), Ty::Ref(y)) => self.unify(x, y),
            (Ty::Ref(x), t) | (t, Ty::Ref(x)) => self.unify(x, t),
            (Ty::Int { .. }, Ty::Int { .. })
            | (Ty::Bool, Ty::Bool)
            | (Ty::Str { .. }, Ty::Str { .. })
            | (Ty::Bytes { .. }, Ty::Bytes { .. })
            | (Ty::None, Ty::None)
            | (Ty::Meter { .. }, Ty::Meter { .. })
            | (Ty::Bloom { .. }, Ty::Bloom { .. }) => Ok(()),
            (Ty::Record(x, _), Ty::Record(y, _)) if x == y => Ok(()),
            (Ty::List(x, _), Ty::List(y, _)) => self.unify(x, y),
            (Ty::Dict(k1, v1, _), Ty::Dict(k2, v2, _)) => {
                self.unify(k1, k2)?;
                self.unify(v1, v2)
            }
            (Ty::Tuple(xs), Ty::Tuple(ys)) if xs.len() == ys.len() => {
                for (x, y) in xs.iter().zip(ys) {
                    self.unify(x, y)?;
                }
                Ok(())
            }
            (Ty::Chan(x), Ty::Chan(y)) | (Ty::ChanArray(x, _), Ty::ChanArray(y, _)) => {
                self.unify_side(&x.input, &y.input)?;
                self.unify_side(&x.output, &y.output)
            }
            _ => Err(Mismatch),
        }
    }

    fn unify_side(&mut self, a: &Option<Box<Ty>>, b: &Option<Box<Ty>>) -> Result<(), Mismatch> {
        match (a, b) {
            (None, None) => Ok(()),
            (Some(x), Some(y)) => self.unify(x, y),
            _ => Err(Mismatch),
        }
    }
}
