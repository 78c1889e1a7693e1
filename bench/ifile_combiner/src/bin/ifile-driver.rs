//! `ifile-driver`: the load side of `bench/run.sh`'s Hadoop benchmark. It
//! plays the mappers and the reducer for any aggregator that takes mapper
//! IFile streams on one address and dials a reducer: Flick's
//! `examples/hadoop_wordcount.flick` and the hand-written `ifile-combiner`.
//!
//! * `run`: listens as the reducer, opens one connection per input file to
//!   the aggregator, sends every file at once as fast as the aggregator
//!   takes it, and reads the reducer stream to EOF. It times from the first
//!   byte sent to the reducer's EOF, checks the output (CRC32, strictly
//!   increasing `Text` keys, the sum of all counts, and every count against
//!   an `expected.tsv` if given), saves it, and prints one JSON line.
//! * `generate`: writes word-count mapper files like `interop/hadoop`'s
//!   `generate` (a vocabulary of 8/12/16-letter words drawn with a skewed
//!   distribution, split into contiguous shares, one `(word, 1)` record per
//!   occurrence, sorted), for machines without Java and Maven.
//!
//! Run: `ifile-driver run --mappers ADDR --reducer ADDR [--out FILE] [--expected TSV] [--timeout-s S] FILE...`
//!      `ifile-driver generate --out DIR [--mappers 8] [--words N] [--seed S] [--vocab 3000]`

use ifile_combiner::{parse_file, text_cmp, text_payload, write_vint, IFileWriter};
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const USAGE: &str = "usage:
  ifile-driver run --mappers ADDR --reducer ADDR [--out FILE] [--expected TSV] [--timeout-s S] FILE...
  ifile-driver generate --out DIR [--mappers 8] [--words N] [--seed S] [--vocab 3000]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        Some("generate") => generate(&args[1..]),
        _ => Err(String::new()),
    };
    match result {
        Ok(code) => code,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("ifile-driver: {msg}");
            }
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// `--name value` pairs and the remaining positional arguments.
fn parse_flags(args: &[String]) -> Result<(HashMap<String, String>, Vec<String>), String> {
    let mut flags = HashMap::new();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(name) = a.strip_prefix("--") {
            let v = it.next().ok_or(format!("{a} needs a value"))?;
            flags.insert(name.to_string(), v.clone());
        } else {
            rest.push(a.clone());
        }
    }
    Ok((flags, rest))
}

fn flag_num<T: std::str::FromStr>(
    flags: &HashMap<String, String>,
    name: &str,
    default: T,
) -> Result<T, String> {
    match flags.get(name) {
        Some(v) => v.parse().map_err(|_| format!("--{name}: bad number {v}")),
        None => Ok(default),
    }
}

/// The JSON string literal of `s`.
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Connects, retrying while the aggregator is still starting. A probe
/// connection is not an option: to a fan-in listener it is a mapper.
fn connect_retrying(addr: &str, deadline: Instant) -> io::Result<TcpStream> {
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The reducer side: accepts one connection and reads it to EOF. Returns
/// the bytes and when EOF came.
fn reducer(listener: TcpListener, deadline: Instant) -> io::Result<(Vec<u8>, Instant)> {
    listener.set_nonblocking(true)?;
    let mut conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the aggregator never dialled the reducer",
                    ));
                }
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    };
    conn.set_nonblocking(false)?;
    let mut out = Vec::with_capacity(1 << 20);
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no EOF from the aggregator ({} bytes so far)", out.len()),
            ));
        }
        conn.set_read_timeout(Some(left))?;
        match conn.read(&mut buf) {
            Ok(0) => return Ok((out, Instant::now())),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Checks of one reducer stream.
struct OutputCheck {
    records: usize,
    total: i64,
    problem: Option<String>,
}

fn check_output(bytes: &[u8], expected: Option<&HashMap<Vec<u8>, i64>>) -> OutputCheck {
    let parsed = match parse_file(bytes) {
        Ok(p) => p,
        Err(e) => {
            return OutputCheck {
                records: 0,
                total: 0,
                problem: Some(e),
            }
        }
    };
    let mut problem = None;
    let mut total = 0i64;
    let mut prev: Option<&[u8]> = None;
    for (i, (range, value)) in parsed.records.iter().enumerate() {
        let key = &bytes[range.clone()];
        total += *value as i64;
        if problem.is_none() {
            if let Some(p) = prev {
                if text_cmp(p, key) != Ordering::Less {
                    problem = Some(format!(
                        "record {i}: key {:?} not strictly greater than {:?}",
                        String::from_utf8_lossy(text_payload(key)),
                        String::from_utf8_lossy(text_payload(p))
                    ));
                }
            }
        }
        if problem.is_none() {
            if let Some(exp) = expected {
                let word = text_payload(key);
                match exp.get(word) {
                    Some(&c) if c == *value as i64 => {}
                    Some(&c) => {
                        problem = Some(format!(
                            "record {i}: word {:?} count {value}, expected {c}",
                            String::from_utf8_lossy(word)
                        ))
                    }
                    None => {
                        problem = Some(format!(
                            "record {i}: extra word {:?}",
                            String::from_utf8_lossy(word)
                        ))
                    }
                }
            }
        }
        prev = Some(key);
    }
    if problem.is_none() {
        if let Some(exp) = expected {
            if exp.len() != parsed.records.len() {
                problem = Some(format!(
                    "{} words, expected {}",
                    parsed.records.len(),
                    exp.len()
                ));
            }
        }
    }
    OutputCheck {
        records: parsed.records.len(),
        total,
        problem,
    }
}

fn read_expected(path: &str) -> Result<HashMap<Vec<u8>, i64>, String> {
    let text = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let mut map = HashMap::new();
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let tab = line
            .iter()
            .rposition(|&b| b == b'\t')
            .ok_or(format!("{path}: a line without a tab"))?;
        let count: i64 = std::str::from_utf8(&line[tab + 1..])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or(format!("{path}: a bad count"))?;
        map.insert(line[..tab].to_vec(), count);
    }
    Ok(map)
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let (flags, inputs) = parse_flags(args)?;
    let mappers_addr = flags.get("mappers").ok_or("--mappers ADDR is required")?;
    let reducer_addr = flags.get("reducer").ok_or("--reducer ADDR is required")?;
    let timeout = Duration::from_secs_f64(flag_num(&flags, "timeout-s", 120.0)?);
    if inputs.is_empty() {
        return Err("no mapper input files".into());
    }
    let expected = match flags.get("expected") {
        Some(p) => Some(read_expected(p)?),
        None => None,
    };

    // Everything is read and counted before the clock starts, so the disk
    // is not measured.
    let mut files = Vec::new();
    let (mut input_records, mut input_total) = (0usize, 0i64);
    for path in &inputs {
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        let parsed = parse_file(&bytes).map_err(|e| format!("{path}: {e}"))?;
        input_records += parsed.records.len();
        input_total += parsed.records.iter().map(|r| r.1 as i64).sum::<i64>();
        files.push(Arc::new(bytes));
    }
    let input_bytes: usize = files.iter().map(|f| f.len()).sum();

    let listener =
        TcpListener::bind(reducer_addr).map_err(|e| format!("reducer {reducer_addr}: {e}"))?;
    let deadline = Instant::now() + timeout;
    let reducer_thread = thread::spawn(move || reducer(listener, deadline));

    let mut conns = Vec::new();
    for _ in &files {
        let c = connect_retrying(mappers_addr, Instant::now() + Duration::from_secs(15))
            .map_err(|e| format!("mapper connection to {mappers_addr}: {e}"))?;
        c.set_write_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        conns.push(c);
    }
    let barrier = Arc::new(Barrier::new(files.len() + 1));
    let senders: Vec<_> = conns
        .iter()
        .zip(&files)
        .map(|(c, f)| {
            let (mut c, f, barrier) = (c.try_clone().unwrap(), Arc::clone(f), Arc::clone(&barrier));
            thread::spawn(move || -> io::Result<Instant> {
                barrier.wait();
                c.write_all(&f)?;
                c.shutdown(Shutdown::Write)?;
                Ok(Instant::now())
            })
        })
        .collect();
    let started = Instant::now();
    barrier.wait();

    let mut error: Option<String> = None;
    let mut sent_at = started;
    for s in senders {
        match s.join().expect("sender thread") {
            Ok(t) => sent_at = sent_at.max(t),
            Err(e) => {
                error.get_or_insert(format!("sending mapper input: {e}"));
            }
        }
    }
    let (output, eof_at) = match reducer_thread.join().expect("reducer thread") {
        Ok(r) => r,
        Err(e) => {
            error.get_or_insert(format!("reducer: {e}"));
            (Vec::new(), Instant::now())
        }
    };
    drop(conns);
    let seconds = eof_at.duration_since(started).as_secs_f64();

    if let Some(path) = flags.get("out") {
        std::fs::write(path, &output).map_err(|e| format!("{path}: {e}"))?;
    }
    let check = check_output(&output, expected.as_ref());
    if error.is_none() {
        if let Some(p) = check.problem {
            error = Some(format!("wrong output: {p}"));
        } else if check.total != input_total {
            error = Some(format!(
                "wrong output: counts add up to {}, the input's to {input_total}",
                check.total
            ));
        }
    }
    let ok = error.is_none();
    println!(
        "{{\"ok\": {ok}, \"error\": {}, \"seconds\": {seconds:.6}, \"send_seconds\": {:.6}, \
         \"input_bytes\": {input_bytes}, \"input_records\": {input_records}, \
         \"output_bytes\": {}, \"output_records\": {}, \"mb_per_s\": {:.3}, \
         \"reduction\": {:.3}, \"checked_against_expected\": {}}}",
        error.as_deref().map_or("null".to_string(), json_str),
        sent_at.duration_since(started).as_secs_f64(),
        output.len(),
        check.records,
        input_bytes as f64 / 1e6 / seconds,
        input_bytes as f64 / output.len().max(1) as f64,
        expected.is_some(),
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// splitmix64: small, seeded, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn generate(args: &[String]) -> Result<ExitCode, String> {
    let (flags, rest) = parse_flags(args)?;
    if !rest.is_empty() {
        return Err(format!("unexpected argument {}", rest[0]));
    }
    let dir = PathBuf::from(flags.get("out").ok_or("--out DIR is required")?);
    let mappers: usize = flag_num(&flags, "mappers", 8)?;
    let words: usize = flag_num(&flags, "words", 200_000)?;
    let seed: u64 = flag_num(&flags, "seed", 1)?;
    let vocab_size: usize = flag_num(&flags, "vocab", 3000)?;
    if mappers == 0 || vocab_size == 0 {
        return Err("--mappers and --vocab must be positive".into());
    }
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;

    let mut rng = Rng(seed);
    let mut seen = HashSet::new();
    let mut vocab: Vec<Vec<u8>> = Vec::with_capacity(vocab_size);
    while vocab.len() < vocab_size {
        let len = [8, 12, 16][vocab.len() % 3];
        let w: Vec<u8> = (0..len).map(|_| b'a' + (rng.next() % 26) as u8).collect();
        if seen.insert(w.clone()) {
            vocab.push(w);
        }
    }
    // Skewed, as the Java harness: index = floor(V * u^2).
    let text: Vec<u32> = (0..words)
        .map(|_| {
            let u = rng.unit();
            ((vocab_size as f64 * u * u) as usize).min(vocab_size - 1) as u32
        })
        .collect();

    let mut expected: BTreeMap<&[u8], i64> = BTreeMap::new();
    let share = words.div_ceil(mappers);
    for m in 0..mappers {
        let lo = (m * share).min(words);
        let hi = ((m + 1) * share).min(words);
        let mut part: Vec<&[u8]> = text[lo..hi]
            .iter()
            .map(|&i| &vocab[i as usize][..])
            .collect();
        // ASCII words: Text order is byte order.
        part.sort_unstable();
        let mut w = IFileWriter::new(Vec::new());
        let mut key = Vec::with_capacity(32);
        for word in &part {
            key.clear();
            write_vint(&mut key, word.len() as i64);
            key.extend_from_slice(word);
            w.record(&key, 1).map_err(|e| e.to_string())?;
            *expected.entry(word).or_default() += 1;
        }
        let (bytes, _) = w.finish().map_err(|e| e.to_string())?;
        let path = dir.join(format!("mapper-{m}.ifile"));
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let mut tsv = Vec::new();
    for (word, count) in &expected {
        tsv.extend_from_slice(word);
        writeln!(tsv, "\t{count}").map_err(|e| e.to_string())?;
    }
    let path = dir.join("expected.tsv");
    std::fs::write(&path, tsv).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(ExitCode::SUCCESS)
}
