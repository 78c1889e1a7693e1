//! The resource-sharing experiment of the FLICK paper (section 6.4,
//! Figure 7): 200 tasks share the workers, half light (1 KB items) and half
//! heavy (16 KB items), each adding up every byte of its items. Under each
//! scheduling policy it prints when the light and the heavy tasks finish.
//!
//! Expected shape, as in the paper: with the cooperative policy the light
//! tasks finish well before the heavy ones, and the whole run takes no
//! longer; with one-item round-robin the light tasks finish only with the
//! heavy ones.
//!
//! Run: `cargo run --release -p resource-sharing -- [--items N] [--workers N] [--timeslice-us N]`

use flick_runtime::{Policy, Scheduler, SchedulerConfig, TaskStatus, Timeslice};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Options {
    tasks: usize,
    items: usize,
    workers: usize,
    timeslice: Duration,
}

fn options() -> Options {
    let mut o = Options {
        tasks: 200,
        items: 200,
        workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
        timeslice: Duration::from_micros(50),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = |i: usize| -> usize {
            args.get(i + 1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{} needs a number", args[i]))
        };
        match args[i].as_str() {
            "--tasks" => o.tasks = value(i),
            "--items" => o.items = value(i),
            "--workers" => o.workers = value(i),
            "--timeslice-us" => o.timeslice = Duration::from_micros(value(i) as u64),
            "--help" | "-h" => {
                println!(
                    "resource-sharing [--tasks N] [--items N] [--workers N] [--timeslice-us N]"
                );
                std::process::exit(0);
            }
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    o
}

/// Completion times of the light and the heavy tasks, and the whole run.
struct Outcome {
    light: Vec<Duration>,
    heavy: Vec<Duration>,
    total: Duration,
}

fn run(o: &Options, policy: Policy) -> Outcome {
    let light_item: Arc<[u8]> = (0..1024).map(|i| i as u8).collect();
    let heavy_item: Arc<[u8]> = (0..16 * 1024).map(|i| i as u8).collect();
    let finished: Arc<Mutex<Vec<(bool, Duration)>>> =
        Arc::new(Mutex::new(Vec::with_capacity(o.tasks)));
    let s = Scheduler::start(SchedulerConfig {
        workers: o.workers,
        policy,
        capacity: o.tasks,
        pin: true,
    });
    // Every task is queued before any may run, so no class starts first.
    let ids: Vec<_> = (0..o.tasks)
        .map(|_| s.reserve().expect("capacity"))
        .collect();
    let start = Instant::now();
    for (i, id) in ids.into_iter().enumerate() {
        let heavy = i % 2 == 1;
        let item = if heavy {
            heavy_item.clone()
        } else {
            light_item.clone()
        };
        let finished = finished.clone();
        let mut left = o.items;
        let mut sum: u64 = 0;
        s.start_task(
            id,
            Box::new(move |slice: &mut Timeslice| {
                while left > 0 {
                    sum = item.iter().fold(sum, |acc, b| acc.wrapping_add(*b as u64));
                    left -= 1;
                    if left > 0 && slice.item_done() {
                        return TaskStatus::Yield;
                    }
                }
                std::hint::black_box(sum);
                finished.lock().unwrap().push((heavy, start.elapsed()));
                TaskStatus::Done
            }),
        );
    }
    assert!(
        s.wait_all_done(Duration::from_secs(600)),
        "tasks did not finish"
    );
    let total = start.elapsed();
    s.shutdown();
    let finished = finished.lock().unwrap();
    let class = |h: bool| {
        let mut v: Vec<Duration> = finished
            .iter()
            .filter(|(x, _)| *x == h)
            .map(|(_, t)| *t)
            .collect();
        v.sort();
        v
    };
    Outcome {
        light: class(false),
        heavy: class(true),
        total,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn summary(v: &[Duration]) -> (f64, f64, f64) {
    let median = v[v.len() / 2];
    let mean = v.iter().sum::<Duration>() / v.len() as u32;
    (ms(median), ms(mean), ms(*v.last().unwrap()))
}

fn main() {
    let o = options();
    println!(
        "resource sharing: {} tasks (half 1 KB items, half 16 KB items), {} items each, {} workers",
        o.tasks, o.items, o.workers
    );
    println!();
    println!("| policy | light median ms | light mean ms | light last ms | heavy median ms | heavy mean ms | heavy last ms | total ms | light/heavy median |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let policies = [
        (
            format!("cooperative ({} us)", o.timeslice.as_micros()),
            Policy::Cooperative {
                timeslice: o.timeslice,
            },
        ),
        ("run to completion".to_string(), Policy::RunToCompletion),
        ("round-robin (1 item)".to_string(), Policy::RoundRobin),
    ];
    for (name, policy) in policies {
        let out = run(&o, policy);
        let (lm, la, ll) = summary(&out.light);
        let (hm, ha, hl) = summary(&out.heavy);
        println!(
            "| {name} | {lm:.1} | {la:.1} | {ll:.1} | {hm:.1} | {ha:.1} | {hl:.1} | {:.1} | {:.2} |",
            ms(out.total),
            lm / hm
        );
    }
}
