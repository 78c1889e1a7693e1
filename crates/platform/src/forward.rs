//! Messages as a proxy passes them on: the grammar's `%forward` edits
//! (HTTP's hop-by-hop header fields, `X-Forwarded-For`) applied just before
//! a message goes to its writer. The values a message was parsed with stay
//! with its original bytes; only what is written changes.

use crate::compute::GraphHost;
use crate::msg::{Msg, Part};
use flick_wire::ForwardContext;
use std::net::IpAddr;

/// The client's address as text, worked out once per instance.
#[derive(Clone, Copy)]
pub struct ClientAddress {
    text: [u8; 46],
    len: u8,
    known: bool,
}

impl Default for ClientAddress {
    fn default() -> ClientAddress {
        ClientAddress {
            text: [0; 46],
            len: 0,
            known: false,
        }
    }
}

impl ClientAddress {
    fn set(&mut self, ip: IpAddr) {
        use std::io::Write;
        let mut at = &mut self.text[..];
        let _ = write!(at, "{ip}");
        let left = at.len();
        self.len = (self.text.len() - left) as u8;
        self.known = true;
    }

    fn as_bytes(&self) -> &[u8] {
        &self.text[..self.len as usize]
    }
}

impl GraphHost {
    /// Rewrites `m`, about to go to output `out`, as the grammar says a
    /// proxy passes it on; unchanged if its unit has no `%forward`.
    pub(crate) fn edit_forwarded(&mut self, out: usize, m: &mut Msg) {
        if let Some(mut edited) = self.forwarded(out, m) {
            std::mem::swap(&mut m.bytes, &mut edited.bytes);
            m.body_at = edited.body_at;
            self.pool.give(edited);
        }
    }

    /// `m` as it is passed on to output `out`, as a new message of bytes
    /// alone (what a writer writes), where the grammar's `%forward`
    /// changes it; `None` where `m` goes as it is. Asked once per message
    /// sent: the last reply of a session holds its connection to close.
    pub(crate) fn forwarded(&mut self, out: usize, m: &Msg) -> Option<Msg> {
        if !matches!(m.part, Part::Whole | Part::Head) {
            return None;
        }
        let chan = self.outputs[out].chan;
        let unit = self.out_units.get(chan as usize).copied().flatten()?;
        if !self.grammar.has_forward(unit) {
            return None;
        }
        // Asked here alone: a session that ends is held to close.
        let session_ends = match chan == self.client_chan {
            true => self.session_ends(m.part),
            false => self.ending && self.last_reply(m.part),
        };
        // A reply the program built says `Connection: close` only on its
        // last: before that it passes on unchanged, not written again.
        if !self.grammar.forward_changes(unit, session_ends) {
            return None;
        }
        if !self.client_address.known {
            let peer = self
                .outputs
                .iter()
                .find(|o| o.chan == self.client_chan)
                .and_then(|o| o.conn.as_ref())
                .and_then(|c| c.0.stream.peer_addr().ok());
            if let Some(a) = peer {
                self.client_address.set(a.ip());
            }
        }
        let cx = ForwardContext {
            peer_address: self.client_address.as_bytes(),
            session_ends,
        };
        let mut edited = self.pool.take();
        // A reply read whole with its body: its head is rewritten, and
        // the body follows as it came.
        let body = m.body_at as usize;
        let head_only = m.part == Part::Head || body > 0;
        let head = &m.bytes[..if body > 0 { body } else { m.bytes.len() }];
        if self
            .grammar
            .forward(unit, &m.slots, head, head_only, &cx, &mut edited.bytes)
            .is_err()
        {
            self.pool.give(edited);
            return None;
        }
        if body > 0 {
            edited.body_at = edited.bytes.len() as u32;
            edited.bytes.extend_from_slice(&m.bytes[body..]);
        }
        edited.part = m.part;
        edited.continued = m.continued;
        Some(edited)
    }

    /// Whether a reply going to the client is its last one before its
    /// connection closes; if so, the connection is held to close. A
    /// connection that a draining version hands to its successor
    /// (`Conn::hand_over`) stays open: its last reply here says so.
    fn session_ends(&self, part: Part) -> bool {
        if !self.ending || !self.last_reply(part) {
            return false;
        }
        let client = self
            .outputs
            .iter()
            .find(|o| o.chan == self.client_chan)
            .and_then(|o| o.conn.as_ref());
        match client {
            Some((conn, _)) if conn.parked() => false,
            Some((conn, _)) => {
                conn.end_session();
                true
            }
            None => true,
        }
    }

    /// Whether a reply being passed on is the client's last: no other
    /// request waits for its reply (a streaming reply's own request is
    /// still outstanding until its body ends).
    fn last_reply(&self, part: Part) -> bool {
        let waiting: usize = self.peers.iter().map(|p| p.outstanding.len()).sum();
        let own = usize::from(part == Part::Head);
        waiting <= own && self.ready.is_empty()
    }
}
