//! What a new version of a service takes over from the old one it
//! replaces, shared by `flick serve`'s redeploy and `flick run`'s reload
//! on SIGHUP: the new version starts beside the old on the same platform
//! (listeners with SO_REUSEPORT), then the old one drains.
//!
//! Only `global` integers, booleans and strings of the same name and type
//! are carried over; dictionaries start empty.

use flick_platform::{Service, StateValue};

/// A state variable as a version declares it: name, type, and whether it
/// is `global`.
pub type StateVar = (String, String, bool);

/// The state variables of a checked process, in declaration order.
pub fn state_vars(process: &flick_check::Process) -> Vec<StateVar> {
    process
        .state
        .iter()
        .map(|v| {
            (
                v.name.clone(),
                v.ty.to_string(),
                v.scope == flick_syntax::ast::StateScope::Global,
            )
        })
        .collect()
}

/// Copies the old version's `global` integers, booleans and strings into
/// the new one where a global of the same name and type is declared; what
/// was carried, by name.
pub fn carry_globals(
    old: &Service,
    old_state: &[StateVar],
    new: &Service,
    new_state: &[StateVar],
) -> Vec<String> {
    let mut carried = Vec::new();
    for (name, ty, global) in new_state {
        let same = old_state
            .iter()
            .any(|(n, t, g)| n == name && t == ty && *g && *global);
        if !same {
            continue;
        }
        if let Ok(v @ (StateValue::Int(_) | StateValue::Bool(_) | StateValue::Bytes(_))) =
            old.read_global(name)
        {
            if new.write_global(name, v).is_ok() {
                carried.push(name.clone());
            }
        }
    }
    carried
}
