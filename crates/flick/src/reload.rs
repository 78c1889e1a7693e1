//! What a new version of a service takes over from the old one it
//! replaces, shared by `flick serve`'s redeploy and `flick run`'s reload
//! on SIGHUP: the new version starts beside the old on the same platform
//! (listeners with SO_REUSEPORT), takes over the old one's listening
//! sockets once its state is carried (`start_next`), then the old one
//! drains. No listening socket closes across a reload, so a connection
//! waiting in a backlog is accepted by the new version, never reset.
//!
//! `global` integers, booleans and strings, and `global` dictionaries, of
//! the same name and type are carried over (a dictionary entry by entry,
//! oldest first, so it evicts in the same order); `local` state starts
//! afresh.

use flick_platform::{
    EntryRef, EntryValue, Loaded, Platform, Service, ServiceConfig, StartError, StateValue,
};

/// Starts the next version of `old` on `platform`: its string
/// dictionaries bounded and `old`'s `global` state carried over before it
/// accepts, then it takes over `old`'s listening sockets
/// (`Service::start_replacing`); `old` accepts no more and is left to
/// drain. The new version and what was carried, by name.
pub fn start_next(
    platform: &Platform,
    loaded: Loaded,
    config: ServiceConfig,
    old: &Service,
    old_state: &[StateVar],
    new_state: &[StateVar],
) -> Result<(Service, Vec<String>), StartError> {
    let mut carried = Vec::new();
    let service = Service::start_replacing(platform, loaded, config, old, &mut |new| {
        bound_dicts(new, new_state);
        carried = carry_globals(old, old_state, new, new_state);
    })?;
    // Bound elsewhere: from here on only the new version accepts.
    old.stop_accepting();
    Ok((service, carried))
}

/// What a dictionary's entries hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DictOf {
    /// Messages: records of the grammar unit so named.
    Messages(String),
    /// Integers, booleans or strings (or bytes), with a string's declared
    /// maximum length.
    Values(Scalar, Option<u64>),
    /// Values of another type (tuples, lists), named by their type, which
    /// the operator can neither read nor write.
    Other(String),
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
                    flick_check::Ty::Int { .. } => DictOf::Values(Scalar::Int, None),
                    flick_check::Ty::Bool => DictOf::Values(Scalar::Bool, None),
                    flick_check::Ty::Str { max } | flick_check::Ty::Bytes { max } => {
                        DictOf::Values(Scalar::Bytes, Some(*max))
                    }
                    other => DictOf::Other(other.to_string()),
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

/// The entries of a dictionary, oldest first: key and value (a message's
/// wire bytes, or an integer, boolean or string).
pub type Entries = Vec<(Vec<u8>, EntryValue)>;

/// Every entry of a service's `global` dictionary, oldest first.
pub fn dict_entries(service: &Service, name: &str) -> Entries {
    let mut out = Vec::new();
    if let Ok(d) = service.global_dict(name) {
        let _ = d.entries(0, usize::MAX, |k, v| out.push((k.to_vec(), v.to_owned())));
    }
    out
}

/// Whether `value` is of the kind a dictionary of `of` holds (a string
/// within its declared maximum: a type's text does not show it, so a
/// version that lowers it still names the same type).
pub fn holds(of: &DictOf, value: &EntryValue) -> bool {
    match (of, value) {
        (DictOf::Values(Scalar::Bytes, max), EntryValue::Bytes(b)) => {
            max.is_none_or(|m| b.len() as u64 <= m)
        }
        _ => matches!(
            (of, value),
            (DictOf::Messages(_), EntryValue::Message(_))
                | (DictOf::Values(Scalar::Int, _), EntryValue::Int(_))
                | (DictOf::Values(Scalar::Bool, _), EntryValue::Bool(_))
        ),
    }
}

/// Writes `entries` into `service`'s dictionary `var` (of messages of a
/// unit, or of values), in order; how many were taken. One that does not
/// parse as the unit (the grammar changed), or is not of the kind the
/// dictionary holds, is skipped and logged; at a full dictionary (a
/// smaller capacity) it stops.
pub fn put_entries(service: &Service, var: &str, of: &DictOf, entries: &Entries) -> usize {
    let Ok(d) = service.global_dict(var) else {
        return 0;
    };
    let mut taken = 0;
    for (key, value) in entries {
        if !holds(of, value) {
            tracing::warn!(dictionary = %var, key = %String::from_utf8_lossy(key), "entry not taken: not of the dictionary's kind, or longer than its maximum");
            continue;
        }
        let put = match (of, value) {
            (DictOf::Messages(unit), EntryValue::Message(bytes)) => d.insert(key, unit, bytes),
            (_, EntryValue::Int(n)) => d.insert_value(key, EntryRef::Int(*n)),
            (_, EntryValue::Bool(b)) => d.insert_value(key, EntryRef::Bool(*b)),
            (_, EntryValue::Bytes(b)) => d.insert_value(key, EntryRef::Bytes(b)),
            _ => continue,
        };
        match put {
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
        if let Some(of @ (DictOf::Messages(_) | DictOf::Values(..))) = &var.dict {
            let entries = dict_entries(old, &var.name);
            if !entries.is_empty() {
                put_entries(new, &var.name, of, &entries);
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

/// Gives each `global` dictionary of strings with a small declared
/// maximum entries made with room for one (`GlobalDict::bound_strings`),
/// so the program's sets allocate nothing.
pub fn bound_dicts(service: &Service, state: &[StateVar]) {
    for var in state.iter().filter(|v| v.global) {
        if let Some(DictOf::Values(Scalar::Bytes, Some(max))) = &var.dict {
            if let Ok(d) = service.global_dict(&var.name) {
                d.bound_strings(*max);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_taken_only_by_a_dictionary_of_its_kind_and_size() {
        let strings = DictOf::Values(Scalar::Bytes, Some(3));
        assert!(holds(&strings, &EntryValue::Bytes(b"abc".to_vec())));
        assert!(!holds(&strings, &EntryValue::Bytes(b"abcd".to_vec())));
        assert!(!holds(&strings, &EntryValue::Int(1)));
        let ints = DictOf::Values(Scalar::Int, None);
        assert!(holds(&ints, &EntryValue::Int(1)));
        assert!(!holds(&ints, &EntryValue::Bool(true)));
        let messages = DictOf::Messages("request".into());
        assert!(holds(&messages, &EntryValue::Message(b"GET".to_vec())));
        assert!(!holds(&messages, &EntryValue::Bytes(b"GET".to_vec())));
        assert!(!holds(
            &DictOf::Other("(integer, integer)".into()),
            &EntryValue::Int(1)
        ));
    }
}
