//! The XDP program an AF_XDP port needs: every frame arriving on a queue
//! whose entry in an `XSKMAP` holds a socket goes to that socket, every
//! other frame on to the kernel's stack (`XDP_PASS`).
//!
//! Built here from six instructions rather than compiled from C, so the
//! port needs neither a BPF compiler nor libbpf at build or run time: the
//! `bpf(2)` system call makes the map and loads the program, and a BPF
//! link (Linux 5.9 on) attaches it to the interface. Dropping
//! [`XdpRedirect`] closes the link, which detaches the program; a port that
//! dies takes its program with it.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type`'s `BPF_XDP`.
const BPF_XDP: u32 = 37;
/// `bpf_redirect_map`'s helper number.
const HELPER_REDIRECT_MAP: i32 = 51;
/// `src_reg` of a 64-bit immediate load that names a map by its fd.
const PSEUDO_MAP_FD: u8 = 1;
const XDP_PASS: i32 = 2;
/// `struct xdp_md`'s `rx_queue_index`.
const RX_QUEUE_INDEX: i16 = 16;
/// Entries in the socket map: queues `0..MAP_ENTRIES` can be bound.
pub(crate) const MAP_ENTRIES: u32 = 256;

/// One `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

/// `return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);` with
/// the map's fd in the 64-bit load (the kernel replaces it by the map).
fn program(map_fd: RawFd) -> [Insn; 6] {
    [
        // r2 = *(u32 *)(r1 + rx_queue_index)
        insn(0x61, 2, 1, RX_QUEUE_INDEX, 0),
        // r1 = map (two instructions)
        insn(0x18, 1, PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0),
        // r3 = XDP_PASS: the action when the queue has no socket
        insn(0xb7, 3, 0, 0, XDP_PASS),
        // call bpf_redirect_map
        insn(0x85, 0, 0, 0, HELPER_REDIRECT_MAP),
        // exit
        insn(0x95, 0, 0, 0, 0),
    ]
}

/// `union bpf_attr` as the commands used here lay it out, padded past the
/// largest of them; unused bytes must be zero.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }

    fn u32_at(mut self, offset: usize, value: u32) -> Attr {
        self.0[offset..offset + 4].copy_from_slice(&value.to_ne_bytes());
        self
    }

    fn u64_at(mut self, offset: usize, value: u64) -> Attr {
        self.0[offset..offset + 8].copy_from_slice(&value.to_ne_bytes());
        self
    }
}

fn bpf(command: libc::c_long, attr: &Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, zero-padded `union bpf_attr` of the size
    // passed.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_ref(attr),
            size_of::<Attr>() as libc::c_uint,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

fn bpf_fd(command: libc::c_long, attr: &Attr) -> io::Result<OwnedFd> {
    let fd = bpf(command, attr)?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The socket map and the program, attached to one interface while this
/// value lives.
pub(crate) struct XdpRedirect {
    map: OwnedFd,
    /// The program and its link, once attached.
    attached: Option<(OwnedFd, OwnedFd)>,
}

impl XdpRedirect {
    /// Makes the socket map. `step` in an error says what failed.
    pub(crate) fn new() -> Result<XdpRedirect, (&'static str, io::Error)> {
        let map = bpf_fd(
            BPF_MAP_CREATE,
            &Attr::new()
                .u32_at(0, BPF_MAP_TYPE_XSKMAP)
                .u32_at(4, 4)
                .u32_at(8, 4)
                .u32_at(12, MAP_ENTRIES),
        )
        .map_err(|e| ("creating the socket map", e))?;
        Ok(XdpRedirect {
            map,
            attached: None,
        })
    }

    /// Sends the frames of `queue` to the AF_XDP socket `socket` (bound to
    /// that queue already).
    pub(crate) fn insert(&self, queue: u32, socket: RawFd) -> io::Result<()> {
        let key = queue;
        let value = socket as u32;
        bpf(
            BPF_MAP_UPDATE_ELEM,
            &Attr::new()
                .u32_at(0, self.map.as_raw_fd() as u32)
                .u64_at(8, std::ptr::from_ref(&key) as u64)
                .u64_at(16, std::ptr::from_ref(&value) as u64),
        )
        .map(drop)
    }

    /// Loads the program and attaches it to `ifindex`, in the driver's mode
    /// where the driver has one, else the generic one. Done after
    /// [`XdpRedirect::insert`], so frames reach the socket from the first.
    pub(crate) fn attach(&mut self, ifindex: u32) -> Result<(), (&'static str, io::Error)> {
        let code = program(self.map.as_raw_fd());
        let license = c"Dual MIT/GPL";
        let program = bpf_fd(
            BPF_PROG_LOAD,
            &Attr::new()
                .u32_at(0, BPF_PROG_TYPE_XDP)
                .u32_at(4, code.len() as u32)
                .u64_at(8, code.as_ptr() as u64)
                .u64_at(16, license.as_ptr() as u64),
        )
        .map_err(|e| ("loading the XDP program", e))?;
        let link = bpf_fd(
            BPF_LINK_CREATE,
            &Attr::new()
                .u32_at(0, program.as_raw_fd() as u32)
                .u32_at(4, ifindex)
                .u32_at(8, BPF_XDP),
        )
        .map_err(|e| ("attaching the XDP program", e))?;
        self.attached = Some((program, link));
        Ok(())
    }
}
