//! Writes to a running machine through its control queue
//! (`MachineService::control`): a global register, a flow register, a
//! flow context's state and a context's removal, each queued at a known
//! frame of the input and applied behind the frames read before it, by
//! every worker; and a run with a control queue allocates nothing per
//! frame.

mod support;

use flick_machine::engine::FlowEdit;
use flick_machine::service::{ControlOp, MachineControl, PendingControl};
use flick_machine::{InPort, MachineService, OutPort, Program};
use flick_packet_io::{PortError, RecvStatus, RxPort, TxPort};
use flick_testkit::alloc::CountingAlloc;
use serde_json::Value as Json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// The counting test runs alone: the other's allocations would count.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// At most `limit` frames from each source host are sent on, counted in
/// its flow context; a context moved to `blocked` sends nothing.
const METER: &str = "grammar packet

machine meter: (packet/packet out)
  global limit: integer := 2

  stage meter:
    key ipv4.src
    capacity 64
    flow packets: integer := 0
    states counting, blocked
    in counting on packet when packets < limit: packets := packets + 1; forward out
    in counting on packet: packets := packets + 1
    in blocked on packet: packets := packets + 1
";

fn program() -> Arc<Program> {
    let lowered = flick_machine::lang::compile(METER).unwrap_or_else(|d| panic!("{d:?}"));
    Arc::new(Program::new(lowered.machine).unwrap())
}

fn udp(src: u32) -> Vec<u8> {
    support::udp(src, 1000)
}

/// Writes queued as the frame numbered `.0` is read: the dispatcher
/// takes them once it has queued that frame, before the next.
type Writes = Vec<(usize, ControlOp)>;

/// Frames handed out one at a time; queues each write at its frame, so
/// it reaches the workers behind exactly the frames up to that one.
struct MemRx {
    frames: Vec<Vec<u8>>,
    next: usize,
    writes: Writes,
    control: MachineControl,
    pending: Arc<Mutex<Vec<PendingControl>>>,
}

impl RxPort for MemRx {
    fn recv_batch(
        &mut self,
        _max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError> {
        let Some(frame) = self.frames.get(self.next) else {
            return Ok(RecvStatus::End);
        };
        for (_, op) in self.writes.iter().filter(|(at, _)| *at == self.next) {
            let queued = self.control.queue(*op).expect("room in the control queue");
            self.pending.lock().unwrap().push(queued);
        }
        f(frame, self.next as u64 * 1000);
        self.next += 1;
        Ok(RecvStatus::Frames(1))
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// Counts frames sent by their IPv4 source's last byte; keeps nothing
/// per frame.
struct CountTx(Arc<[AtomicU64; 256]>);

impl TxPort for CountTx {
    fn send(&mut self, frame: &[u8], _ts: u64) -> Result<(), PortError> {
        self.0[frame[29] as usize].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), PortError> {
        Ok(())
    }
}

/// Serves `frames` with `workers`, `writes` queued at their frames: the
/// frames sent per source host, what each write's workers answered (how
/// many held what it named), the dump.
fn serve(frames: Vec<Vec<u8>>, workers: usize, writes: Writes) -> (Vec<u64>, Vec<usize>, Json) {
    let mut service = MachineService::new(program(), workers).unwrap();
    assert_eq!(service.workers(), workers);
    let control = service.control();
    let pending = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
    let input = InPort {
        number: 1,
        spec: "mem".into(),
        rx: Box::new(MemRx {
            frames,
            next: 0,
            writes,
            control,
            pending: pending.clone(),
        }),
        live: false,
    };
    let output = OutPort {
        number: 1,
        spec: "count".into(),
        tx: Box::new(CountTx(sent.clone())),
    };
    let summary = service
        .run(vec![input], vec![output], &AtomicBool::new(false), None)
        .unwrap();
    // Every worker answered before it ended; nothing is waited for here.
    let held = std::mem::take(&mut *pending.lock().unwrap())
        .into_iter()
        .map(|p| p.wait(std::time::Duration::ZERO).unwrap())
        .collect();
    let by_host = sent.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    (
        by_host,
        held,
        serde_json::from_str(&summary.dump.json()).unwrap(),
    )
}

fn host(n: u32) -> u32 {
    0x0a00_0000 + n
}

fn flow(n: u32, edit: FlowEdit) -> ControlOp {
    let mut key = [0; flick_machine::model::MAX_KEY];
    key[0] = host(n) as u64;
    ControlOp::Flow {
        stage: 0,
        key,
        len: 1,
        edit,
    }
}

/// The context of host `n` in a dump: its state and `packets`.
fn context(dump: &Json, n: u32) -> Option<(String, u64)> {
    let c = dump["stages"]["meter"]
        .as_array()?
        .iter()
        .find(|c| c["key"]["ipv4.src"] == host(n))?;
    Some((
        c["state"].as_str()?.to_string(),
        c["registers"]["packets"].as_u64()?,
    ))
}

#[test]
fn writes_apply_behind_the_frames_read_before_them_in_every_worker() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Ten frames from each of hosts 1 to 4, in turn.
    let frames: Vec<Vec<u8>> = (0..40).map(|i| udp(host(1 + i % 4))).collect();
    let writes = vec![
        // After two frames each (both sent, the limit being 2): 5.
        (7, ControlOp::Global { reg: 0, value: 5 }),
        // After five each (all sent, `packets` at 5 everywhere).
        (19, flow(1, FlowEdit::Register(0, 100))),
        (19, flow(2, FlowEdit::State(1))),
        (19, flow(3, FlowEdit::Remove)),
        (19, flow(9, FlowEdit::Register(0, 1))),
    ];
    for workers in [1, 2] {
        let (sent, held, dump) = serve(frames.clone(), workers, writes.clone());
        // Host 1 over its limit and host 2 blocked send no more; host 3
        // starts again from nothing and sends five more; host 4 had
        // reached the limit of 5.
        assert_eq!(&sent[1..5], [5, 5, 10, 5], "{workers} workers: {dump}");
        // A global is every worker's; a context, one worker's; host 9 has
        // none.
        assert_eq!(held, [workers, 1, 1, 1, 0], "{workers} workers");
        assert_eq!(dump["globals"]["limit"], 5, "{dump}");
        assert_eq!(context(&dump, 1), Some(("counting".into(), 105)), "{dump}");
        assert_eq!(context(&dump, 2), Some(("blocked".into(), 10)), "{dump}");
        assert_eq!(context(&dump, 3), Some(("counting".into(), 5)), "{dump}");
        assert_eq!(context(&dump, 4), Some(("counting".into(), 10)), "{dump}");
    }
}

/// Allocations made by one run over `n` frames with a control queue.
fn allocations(n: usize) -> u64 {
    let frames: Vec<Vec<u8>> = (0..n).map(|i| udp(host(1 + i as u32 % 16))).collect();
    let before = ALLOC.allocations();
    let (sent, _, _) = serve(frames, 2, Vec::new());
    let made = ALLOC.allocations() - before;
    assert_eq!(sent.iter().sum::<u64>(), 32, "two frames of each host sent");
    made
}

#[test]
fn a_run_with_a_control_queue_allocates_nothing_per_frame() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    allocations(1_000);
    let small = allocations(1_000);
    let large = allocations(11_000);
    eprintln!("1,000 frames: {small} allocations; 11,000 frames: {large} allocations");
    assert!(
        large <= small + 16,
        "10,000 more frames made {} more allocations",
        large.saturating_sub(small)
    );
}
