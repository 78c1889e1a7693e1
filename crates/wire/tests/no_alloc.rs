//! Parsing and serialising allocate nothing per message in steady state:
//! a counting global allocator watches a loop over many messages.

use flick_wire::{Grammar, Progress};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Only the parsing thread's allocations count: the test harness's own
    /// threads allocate whenever they like.
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if COUNTING.try_with(|c| c.get()).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Parses `stream` (whole messages back to back) `rounds` times, and
/// serialises each message into a reused buffer.
fn parse_all(grammar: &str, unit: &str, stream: &[u8], rounds: usize) -> usize {
    let g = Grammar::stock(grammar).unwrap();
    let u = g.unit_id(unit).unwrap();
    let mut p = g.parser(u);
    let mut out = Vec::with_capacity(1 << 16);
    let mut slots = p.slots().to_vec();
    // Warm up: the first round may size buffers.
    let mut count = 0;
    for round in 0..rounds + 1 {
        if round == 1 {
            ALLOCATIONS.store(0, Ordering::SeqCst);
            COUNTING.with(|c| c.set(true));
        }
        let mut at = 0;
        while at < stream.len() {
            let Progress::Done(n) = p.parse(&stream[at..]).unwrap() else {
                panic!("whole messages only")
            };
            slots.copy_from_slice(p.slots());
            out.clear();
            g.serialize(u, &mut slots, &stream[at..], &mut out).unwrap();
            at += n;
            p.reset();
            count += 1;
        }
    }
    COUNTING.with(|c| c.set(false));
    count
}

#[test]
fn steady_state_parsing_allocates_nothing() {
    let mut binary = Vec::new();
    for i in 0..50u8 {
        // GET key, and a SET with flags/expiration extras and a value.
        binary.extend_from_slice(&[
            0x80, 0x00, 0, 5, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, i, 0, 0, 0, 0, 0, 0, 0, 0,
        ]);
        binary.extend_from_slice(b"Hello");
        binary.extend_from_slice(&[
            0x80, 0x01, 0, 5, 8, 0, 0, 0, 0, 0, 0, 18, 0, 0, 0, i, 0, 0, 0, 0, 0, 0, 0, 0,
        ]);
        binary.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0x0e, 0x10]);
        binary.extend_from_slice(b"HelloWorld");
    }
    let http = b"GET /index.html HTTP/1.1\r\nHost: example.com\r\nUser-Agent: test\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n"
        .repeat(50);
    let ascii = b"get foo bar\r\nset k 0 0 5\r\nhello\r\ndelete k\r\n".repeat(30);
    let mut ifile = Vec::new();
    for i in 0..50u8 {
        ifile.extend_from_slice(&[6, 4]);
        ifile.extend_from_slice(&[5, b'w', b'o', b'r', b'd', b'0' + i % 10]);
        ifile.extend_from_slice(&[0, 0, 0, i]);
    }
    let mut ipv4 = Vec::new();
    for i in 0..50u8 {
        ipv4.extend_from_slice(&[
            0x45, 0, 0, 40, 0, i, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ]);
    }
    let cases: [(&str, &str, &[u8]); 5] = [
        ("memcached_binary", "cmd", &binary),
        ("http", "request", &http),
        ("memcached_ascii", "request", &ascii),
        ("hadoop_ifile", "record", &ifile),
        ("packet", "ipv4", &ipv4),
    ];
    for (grammar, unit, stream) in cases {
        let n = parse_all(grammar, unit, stream, 20);
        let allocations = ALLOCATIONS.load(Ordering::SeqCst);
        assert!(n >= 50 * 21, "{grammar}: parsed {n}");
        assert_eq!(
            allocations,
            0,
            "{grammar}: {allocations} allocations over {} messages",
            n / 21 * 20
        );
    }
}
