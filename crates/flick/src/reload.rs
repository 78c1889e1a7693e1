//! What a new version of a service takes over from the old one it
//! replaces, shared by `flick serve`'s redeploy and `flick run`'s reload
//! on SIGHUP: the new version starts beside the old on the same platform
//! (listeners with SO_REUSEPORT), then the old one drains.
//!
//! `global` integers, booleans and strings, and `global` dictionaries, of
//! the same name and type are carried over (a dictionary entry by entry,
//! oldest first, so it evicts in the same order); `local` state starts
//! afresh.

use flick_platform::{Service, StateValue};

/// What a dictionary's entries hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DictOf {
    /// Messages: records of the grammar unit so named.
    Messages(String),
    /// Integers, booleans or strings, which a service's dictionaries do
    /// not hold (only messages are stored), named by their type.
    Values(String),
}

/// The kinds of value an operator may write to a `global`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scalar {
    Int,
    Bool,
    /// A string or bytes.
    Bytes,
}

/// A state variable as a version declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateVar {
    pub name: String,
    /// Its type as the program's text writes it.
    pub ty: String,
    pub global: bool,
    /// For a dictionary, what its entries hold.
    pub dict: Option<DictOf>,
    /// For an integer, boolean, string or bytes, which.
    pub scalar: Option<Scalar>,
}

/// The state variables of a checked process, in declaration order.
pub fn state_vars(process: &flick_check::Process) -> Vec<StateVar> {
    process
        .state
        .iter()
        .map(|v| StateVar {
            name: v.name.clone(),
            ty: v.ty.to_string(),
            global: v.scope == flick_syntax::ast::StateScope::Global,
            dict: match &v.ty {
                flick_check::Ty::Dict(_, value, _) => Some(match &**value {
                    flick_check::Ty::Record(_, name) => DictOf::Messages(name.clone()),
                    other => DictOf::Values(other.to_string()),
                }),
                _ => None,
            },
            scalar: match &v.ty {
                flick_check::Ty::Int { .. } => Some(Scalar::Int),
                flick_check::Ty::Bool => Some(Scalar::Bool),
                flick_check::Ty::Str { .. } | flick_check::Ty::Bytes { .. } => Some(Scalar::Bytes),
                _ => None,
            },
        })
        .collect()
}

/// The entries of `old`'s dictionary `name`, oldest first: key and the
/// message's wire bytes.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Every entry of a service's `global` dictionary, oldest first.
pub fn dict_entries(service: &Service, name: &str) -> Entries {
    let mut out = Vec::new();
    if let Ok(d) = service.global_dict(name) {
        let _ = d.entries(0, usize::MAX, |k, v| out.push((k.to_vec(), v.to_vec())));
    }
    out
}

/// Writes `entries` into `service`'s dictionary `var` of messages of
/// `unit`, in order; how many were taken. One that does not parse as the
/// unit (the grammar changed) is skipped and logged; at a full dictionary
/// (a smaller capacity) it stops.
pub fn put_entries(service: &Service, var: &str, unit: &str, entries: &Entries) -> usize {
    let Ok(d) = service.global_dict(var) else {
        return 0;
    };
    let mut taken = 0;
    for (key, bytes) in entries {
        match d.insert(key, unit, bytes) {
            Ok(_) => taken += 1,
            Err(e @ flick_platform::DictError::Full { .. }) => {
                tracing::warn!(dictionary = %var, "entries not taken: {e}");
                break;
            }
            Err(e) => {
                tracing::warn!(dictionary = %var, key = %String::from_utf8_lossy(key), "entry not taken: {e}");
            }
        }
    }
    taken
}

/// Copies the old version's `global` integers, booleans, strings and
/// dictionaries into the new one where a global of the same name and type
/// is declared; what was carried, by name.
pub fn carry_globals(
    old: &Service,
    old_state: &[StateVar],
    new: &Service,
    new_state: &[StateVar],
) -> Vec<String> {
    let mut carried = Vec::new();
    for var in new_state {
        let same = old_state
            .iter()
            .any(|o| o.name == var.name && o.ty == var.ty && o.global && var.global);
        if !same {
            continue;
        }
        if let Some(DictOf::Messages(unit)) = &var.dict {
            let entries = dict_entries(old, &var.name);
            if !entries.is_empty() {
                put_entries(new, &var.name, unit, &entries);
                carried.push(var.name.clone());
            }
            continue;
        }
        if let Ok(v @ (StateValue::Int(_) | StateValue::Bool(_) | StateValue::Bytes(_))) =
            old.read_global(&var.name)
        {
            if new.write_global(&var.name, v).is_ok() {
                carried.push(var.name.clone());
            }
        }
    }
    carried
}
