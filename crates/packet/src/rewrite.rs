//! Header rewriting: the edits a packet program makes to the frame it is
//! handling (TTL decrement, NAT of IPv4 addresses and TCP/UDP ports), each
//! with the checksums it touches brought up to date incrementally
//! (RFC 1624: `HC' = ~(~HC + ~m + m')`), so a rewritten frame leaves with
//! a right IPv4 header checksum and a right TCP or UDP checksum.
//!
//! Edits are recorded while the rule runs and applied once it is done,
//! before the frame goes to its ports: whatever the order of a rule's
//! sends and edits, the frame sent is the edited one.

/// One edit of the frame being handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit {
    /// IPv4 TTL or IPv6 hop limit set to the value.
    Ttl(u8),
    /// The DSCP (0 to 63) of IPv4's type of service byte or IPv6's traffic
    /// class set to the value, the ECN bits kept.
    Dscp(u8),
    IpSrc(u32),
    IpDst(u32),
    SrcPort(u16),
    DstPort(u16),
}

/// Why an edit could not be made: the frame lacks the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("the frame has no IP header to set the TTL of")]
    NoIp,
    #[error("the frame has no IPv4 header to set an address of")]
    NoIpv4,
    #[error("the frame has no TCP or UDP header to set a port of")]
    NoPorts,
}

/// Where the frame's headers start.
struct Layout {
    ip: usize,
    v4: bool,
    /// The TCP or UDP header, and whether it is TCP.
    l4: Option<(usize, bool)>,
}

fn be16(f: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*f.get(at)?, *f.get(at + 1)?]))
}

fn layout(f: &[u8]) -> Option<Layout> {
    let (mut ethertype, mut ip) = (be16(f, 12)?, 14);
    if ethertype == 0x8100 {
        ethertype = be16(f, 16)?;
        ip = 18;
    }
    match ethertype {
        0x0800 => {
            let ihl = (*f.get(ip)? & 0x0f) as usize * 4;
            f.get(ip..ip + 20)?;
            let later_fragment = be16(f, ip + 6)? & 0x1fff != 0;
            let l4 = match f[ip + 9] {
                6 if !later_fragment && f.len() >= ip + ihl + 20 => Some((ip + ihl, true)),
                17 if !later_fragment && f.len() >= ip + ihl + 8 => Some((ip + ihl, false)),
                _ => None,
            };
            Some(Layout { ip, v4: true, l4 })
        }
        0x86dd => {
            f.get(ip..ip + 40)?;
            let l4 = match f[ip + 6] {
                6 if f.len() >= ip + 60 => Some((ip + 40, true)),
                17 if f.len() >= ip + 48 => Some((ip + 40, false)),
                _ => None,
            };
            Some(Layout { ip, v4: false, l4 })
        }
        _ => None,
    }
}

/// The checksum at `at` after a 16-bit word of what it covers changed
/// from `old` to `new` (RFC 1624, equation 3).
fn adjust(f: &mut [u8], at: usize, old: u16, new: u16) {
    let hc = u16::from_be_bytes([f[at], f[at + 1]]);
    let mut sum = (!hc as u32) + (!old as u32) + new as u32;
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[at..at + 2].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

/// Sets the 16-bit word at `at` to `new`, adjusting each checksum in
/// `sums` that covers it.
fn set_word(f: &mut [u8], at: usize, new: u16, sums: &[usize]) {
    let old = u16::from_be_bytes([f[at], f[at + 1]]);
    f[at..at + 2].copy_from_slice(&new.to_be_bytes());
    for &s in sums {
        adjust(f, s, old, new);
    }
}

/// The transport checksum's place, where there is one to keep right: a
/// UDP checksum of zero over IPv4 means "none" and stays so.
fn l4_sum(f: &[u8], l: &Layout) -> Option<usize> {
    let (at, tcp) = l.l4?;
    let sum = if tcp { at + 16 } else { at + 6 };
    (tcp || !l.v4 || be16(f, sum)? != 0).then_some(sum)
}

/// Applies `edit` to `frame`.
pub fn apply(frame: &mut [u8], edit: Edit) -> Result<(), EditError> {
    let Some(l) = layout(frame) else {
        return Err(match edit {
            Edit::Ttl(_) | Edit::Dscp(_) => EditError::NoIp,
            Edit::IpSrc(_) | Edit::IpDst(_) => EditError::NoIpv4,
            Edit::SrcPort(_) | Edit::DstPort(_) => EditError::NoPorts,
        });
    };
    // A UDP checksum in use, looked at before the edit.
    let udp_sum = match l.l4 {
        Some((_, false)) => l4_sum(frame, &l),
        _ => None,
    };
    match edit {
        Edit::Ttl(ttl) if l.v4 => {
            // TTL and protocol share a word of the header checksum.
            let word = u16::from_be_bytes([ttl, frame[l.ip + 9]]);
            set_word(frame, l.ip + 8, word, &[l.ip + 10]);
        }
        Edit::Ttl(hops) => frame[l.ip + 7] = hops,
        Edit::Dscp(dscp) if l.v4 => {
            // Version and header length share a word with the type of
            // service byte in the header checksum.
            let tos = dscp << 2 | frame[l.ip + 1] & 0x03;
            let word = u16::from_be_bytes([frame[l.ip], tos]);
            set_word(frame, l.ip, word, &[l.ip + 10]);
        }
        Edit::Dscp(dscp) => {
            // The traffic class straddles the first two bytes, after the
            // version; no checksum covers it.
            let tc = (frame[l.ip] & 0x0f) << 4 | frame[l.ip + 1] >> 4;
            let tc = dscp << 2 | tc & 0x03;
            frame[l.ip] = frame[l.ip] & 0xf0 | tc >> 4;
            frame[l.ip + 1] = frame[l.ip + 1] & 0x0f | tc << 4;
        }
        Edit::IpSrc(a) | Edit::IpDst(a) => {
            if !l.v4 {
                return Err(EditError::NoIpv4);
            }
            let at = l.ip
                + if matches!(edit, Edit::IpSrc(_)) {
                    12
                } else {
                    16
                };
            // The addresses are in the IPv4 header checksum and in the
            // transport checksum's pseudo-header.
            let (sums, n) = match l4_sum(frame, &l) {
                Some(t) => ([l.ip + 10, t], 2),
                None => ([l.ip + 10, 0], 1),
            };
            set_word(frame, at, (a >> 16) as u16, &sums[..n]);
            set_word(frame, at + 2, a as u16, &sums[..n]);
        }
        Edit::SrcPort(p) | Edit::DstPort(p) => {
            let Some((at, _)) = l.l4 else {
                return Err(EditError::NoPorts);
            };
            let at = at
                + if matches!(edit, Edit::SrcPort(_)) {
                    0
                } else {
                    2
                };
            match l4_sum(frame, &l) {
                Some(t) => set_word(frame, at, p, &[t]),
                None => set_word(frame, at, p, &[]),
            }
        }
    }
    // UDP sends a computed checksum of zero as all ones (RFC 768).
    if let Some(sum) = udp_sum {
        if frame[sum..sum + 2] == [0, 0] {
            frame[sum..sum + 2].copy_from_slice(&[0xff, 0xff]);
        }
    }
    Ok(())
}

/// Writes `bytes` into `frame` at `offset` (nothing where the frame is too
/// short), keeping right each checksum that covers them: the IPv4 header
/// checksum for bytes of the IPv4 header, the TCP or UDP checksum for bytes
/// of its pseudo-header (the addresses) or of the segment. A write to a
/// checksum itself is left as written. For edits a program names by byte
/// offset (FlowBlaze's `setField`), where [`apply`]'s are named by field.
pub fn write_keeping_checksums(frame: &mut [u8], offset: usize, bytes: &[u8]) {
    let end = offset + bytes.len();
    if bytes.is_empty() || frame.len() < end {
        return;
    }
    let l = layout(frame);
    let (ip_sum, l4_at, udp) = match &l {
        Some(l) => (
            l.v4.then_some(l.ip + 10),
            l4_sum(frame, l),
            matches!(l.l4, Some((_, false))),
        ),
        None => (None, None, false),
    };
    // What each checksum covers, in the frame.
    let ip_header = l.as_ref().filter(|l| l.v4).map(|l| {
        let ihl = (frame[l.ip] & 0x0f) as usize * 4;
        l.ip..l.ip + ihl
    });
    let pseudo = l.as_ref().map(|l| {
        if l.v4 {
            l.ip + 12..l.ip + 20
        } else {
            l.ip + 8..l.ip + 40
        }
    });
    let segment = l.as_ref().and_then(|l| {
        let (at, _) = l.l4?;
        let ip_end = if l.v4 {
            l.ip + be16(frame, l.ip + 2)? as usize
        } else {
            l.ip + 40 + be16(frame, l.ip + 4)? as usize
        };
        Some(at..ip_end.min(frame.len()))
    });
    let mut at = offset & !1;
    while at < end {
        let word = |f: &[u8]| u16::from_be_bytes([f[at], f.get(at + 1).copied().unwrap_or(0)]);
        let old = word(frame);
        let (from, to) = (at.max(offset), (at + 2).min(end));
        frame[from..to].copy_from_slice(&bytes[from - offset..to - offset]);
        let new = word(frame);
        if old != new {
            if let Some(s) = ip_sum.filter(|s| *s != at) {
                if ip_header.as_ref().is_some_and(|r| r.contains(&at)) {
                    adjust(frame, s, old, new);
                }
            }
            if let Some(s) = l4_at.filter(|s| *s != at) {
                let covered = pseudo.as_ref().is_some_and(|r| r.contains(&at))
                    || segment.as_ref().is_some_and(|r| r.contains(&at));
                // The IPv4 protocol is in the pseudo-header as [0, protocol].
                let protocol = l.as_ref().is_some_and(|l| l.v4 && at == l.ip + 8);
                if covered || protocol {
                    let (old, new) = match protocol {
                        true => (old & 0xff, new & 0xff),
                        false => (old, new),
                    };
                    adjust(frame, s, old, new);
                    if udp && frame[s..s + 2] == [0, 0] {
                        // UDP sends a computed zero as all ones (RFC 768).
                        frame[s..s + 2].copy_from_slice(&[0xff, 0xff]);
                    }
                }
            }
        }
        at += 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one's-complement sum of `data` folded, complemented.
    fn checksum(data: &[u8]) -> u16 {
        let mut sum: u32 = data
            .chunks(2)
            .map(|w| u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]) as u32)
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// An Ethernet/IPv4 frame with right checksums: TCP or UDP.
    fn frame(tcp: bool, vlan: bool) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        if vlan {
            f.extend_from_slice(&[0x81, 0, 0, 7]);
        }
        f.extend_from_slice(&[8, 0]);
        let ip = f.len();
        let payload = b"hello, packets";
        let l4_len = if tcp { 20 } else { 8 } + payload.len();
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&((20 + l4_len) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 1, 0x40, 0, 64, if tcp { 6 } else { 17 }, 0, 0]);
        f.extend_from_slice(&[10, 0, 0, 1, 192, 168, 1, 9]);
        let l4 = f.len();
        f.extend_from_slice(&40000u16.to_be_bytes());
        f.extend_from_slice(&80u16.to_be_bytes());
        if tcp {
            f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        } else {
            f.extend_from_slice(&(l4_len as u16).to_be_bytes());
            f.extend_from_slice(&[0, 0]);
        }
        f.extend_from_slice(payload);
        fix(&mut f, ip, l4, tcp);
        f
    }

    /// Both checksums computed from scratch.
    fn fix(f: &mut [u8], ip: usize, l4: usize, tcp: bool) {
        f[ip + 10..ip + 12].fill(0);
        let c = checksum(&f[ip..ip + 20]);
        f[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
        let sum = l4 + if tcp { 16 } else { 6 };
        f[sum..sum + 2].fill(0);
        let mut pseudo = f[ip + 12..ip + 20].to_vec();
        pseudo.extend_from_slice(&[0, f[ip + 9]]);
        pseudo.extend_from_slice(&((f.len() - l4) as u16).to_be_bytes());
        pseudo.extend_from_slice(&f[l4..]);
        let c = checksum(&pseudo);
        f[sum..sum + 2].copy_from_slice(&c.to_be_bytes());
    }

    /// After each edit, the incremental checksums equal recomputed ones.
    #[test]
    fn edits_keep_checksums_right() {
        for tcp in [true, false] {
            for vlan in [false, true] {
                let ip = if vlan { 18 } else { 14 };
                let l4 = ip + 20;
                for edit in [
                    Edit::Ttl(63),
                    Edit::Ttl(0),
                    Edit::IpSrc(0xc000_0201),
                    Edit::IpDst(0x0a0a_0a0a),
                    Edit::SrcPort(61000),
                    Edit::DstPort(8080),
                    Edit::Dscp(46),
                    Edit::Dscp(0),
                ] {
                    let mut f = frame(tcp, vlan);
                    apply(&mut f, edit).unwrap();
                    let mut want = f.clone();
                    fix(&mut want, ip, l4, tcp);
                    assert_eq!(f, want, "{edit:?}, tcp {tcp}, vlan {vlan}");
                }
                let mut f = frame(tcp, vlan);
                apply(&mut f, Edit::IpSrc(0xc000_0201)).unwrap();
                assert_eq!(&f[ip + 12..ip + 16], &[192, 0, 2, 1]);
                apply(&mut f, Edit::DstPort(8080)).unwrap();
                assert_eq!(&f[l4 + 2..l4 + 4], &8080u16.to_be_bytes());
            }
        }
    }

    /// A write of one to four bytes at any place from the IP header on
    /// leaves both checksums right, unless it writes a checksum itself.
    #[test]
    fn writes_by_offset_keep_checksums_right() {
        for tcp in [true, false] {
            let (ip, l4) = (14, 34);
            let sums = [ip + 10, l4 + if tcp { 16 } else { 6 }];
            let len = frame(tcp, false).len();
            for offset in ip..len {
                for n in 1..=4 {
                    if offset + n > len
                        || sums.iter().any(|s| offset < s + 2 && *s < offset + n)
                        // The version, header length, total length and
                        // fragment fields say where the rest is: not
                        // rewritten here.
                        || offset < ip + 4
                        || (offset < ip + 8 && ip + 6 < offset + n)
                    {
                        continue;
                    }
                    let mut f = frame(tcp, false);
                    let bytes: Vec<u8> = (0..n).map(|i| 0x5a ^ (offset + i) as u8).collect();
                    write_keeping_checksums(&mut f, offset, &bytes);
                    assert_eq!(&f[offset..offset + n], &bytes[..]);
                    let mut want = f.clone();
                    fix(&mut want, ip, l4, tcp);
                    // A UDP checksum that comes out zero is sent as ones.
                    let s = sums[1];
                    if !tcp && want[s..s + 2] == [0, 0] {
                        want[s..s + 2].copy_from_slice(&[0xff, 0xff]);
                    }
                    assert_eq!(f, want, "tcp {tcp}, {n} bytes at {offset}");
                }
            }
        }
    }

    /// The DSCP is the top 6 bits of IPv4's type of service byte and of
    /// IPv6's traffic class; the ECN bits and the rest stay.
    #[test]
    fn a_dscp_edit_keeps_the_ecn_bits() {
        let mut f = frame(true, false);
        f[15] = 0x03;
        fix(&mut f, 14, 34, true);
        apply(&mut f, Edit::Dscp(10)).unwrap();
        assert_eq!(f[15], 10 << 2 | 0x03);
        let mut six = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd];
        // Version 6, traffic class 0xb9 (DSCP 46, ECN 1), flow label 0x12345.
        six.extend_from_slice(&[0x6b, 0x91, 0x23, 0x45, 0, 0, 59, 64]);
        six.resize(14 + 40, 0);
        apply(&mut six, Edit::Dscp(8)).unwrap();
        assert_eq!(&six[14..18], &[0x62, 0x11, 0x23, 0x45]);
    }

    #[test]
    fn a_udp_checksum_of_zero_stays_zero() {
        let mut f = frame(false, false);
        f[14 + 20 + 6..14 + 20 + 8].fill(0);
        apply(&mut f, Edit::IpSrc(0x0102_0304)).unwrap();
        apply(&mut f, Edit::SrcPort(1)).unwrap();
        assert_eq!(&f[40..42], &[0, 0]);
    }

    #[test]
    fn headers_the_frame_lacks_are_errors() {
        let mut arp = vec![0xff; 12];
        arp.extend_from_slice(&[8, 6]);
        arp.resize(42, 0);
        assert_eq!(apply(&mut arp, Edit::Ttl(1)), Err(EditError::NoIp));
        let mut icmp = frame(true, false);
        icmp[14 + 9] = 1;
        assert_eq!(apply(&mut icmp, Edit::SrcPort(1)), Err(EditError::NoPorts));
        assert!(apply(&mut icmp, Edit::IpDst(1)).is_ok());
    }
}
