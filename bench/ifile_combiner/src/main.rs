//! `ifile-combiner`: a plain hand-written Hadoop word-count combiner, the
//! practical performance limit for Flick's Hadoop aggregator
//! (`examples/hadoop_wordcount.flick`, the paper's Listing 3). `bench/run.sh`
//! drives both through the same network interface and compares them.
//!
//! It listens on an address, takes mapper connections in groups of
//! `--mappers` (8 by default), merges their sorted IFile streams by key
//! (`Text` order), sums the values of equal keys (within and across
//! streams) and writes one IFile stream, with end marker and CRC32, to the
//! reducer address it dials. Then it closes the group and waits for the
//! next one, or exits with `--once`.
//!
//! One thread does everything: reading, merging with a minimum scan over
//! the stream heads (cheaper than a heap for 8 streams), and writing. Keys
//! are compared where they lie in each stream's read buffer, so there is no
//! allocation per record.
//!
//! Run: `ifile-combiner --listen 127.0.0.1:7070 --connect 127.0.0.1:7071 [--mappers 8] [--once]`

use ifile_combiner::{text_cmp, IFileWriter, RecordReader};
use std::cmp::Ordering;
use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Instant;

struct Options {
    listen: String,
    connect: String,
    mappers: usize,
    once: bool,
    quiet: bool,
}

const USAGE: &str =
    "usage: ifile-combiner --listen ADDR --connect ADDR [--mappers N] [--once] [--quiet]";

fn options() -> Result<Options, String> {
    let mut o = Options {
        listen: String::new(),
        connect: String::new(),
        mappers: 8,
        once: false,
        quiet: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--listen" => o.listen = value()?,
            "--connect" => o.connect = value()?,
            "--mappers" => o.mappers = value()?.parse().map_err(|e| format!("--mappers: {e}"))?,
            "--once" => o.once = true,
            "--quiet" => o.quiet = true,
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    if o.listen.is_empty() || o.connect.is_empty() || o.mappers == 0 {
        return Err("--listen, --connect and a positive --mappers are required".into());
    }
    Ok(o)
}

/// What one group's merge did.
struct Summary {
    input_bytes: u64,
    input_records: u64,
    output_bytes: u64,
    output_records: u64,
}

/// Merges the mappers' streams into the reducer's.
fn combine(mappers: Vec<TcpStream>, reducer: TcpStream) -> io::Result<Summary> {
    let mut streams: Vec<RecordReader<TcpStream>> =
        mappers.into_iter().map(RecordReader::new).collect();
    let mut input_records = 0u64;
    for s in &mut streams {
        input_records += s.advance()? as u64;
    }
    let mut out = IFileWriter::new(reducer);
    let mut key = Vec::with_capacity(256);
    let mut output_records = 0u64;
    loop {
        // The first stream holding the least key: every stream before it
        // holds a greater key, so the summing pass starts there.
        let mut least: Option<usize> = None;
        for (i, s) in streams.iter().enumerate() {
            if s.is_done() {
                continue;
            }
            let less = match least {
                None => true,
                Some(l) => text_cmp(s.key(), streams[l].key()) == Ordering::Less,
            };
            if less {
                least = Some(i);
            }
        }
        let Some(first) = least else { break };
        key.clear();
        key.extend_from_slice(streams[first].key());
        let mut sum = 0i32;
        for s in &mut streams[first..] {
            while !s.is_done() && s.key() == key.as_slice() {
                // IntWritable arithmetic: 32-bit two's complement.
                sum = sum.wrapping_add(s.value());
                input_records += s.advance()? as u64;
            }
        }
        out.record(&key, sum)?;
        output_records += 1;
    }
    let (reducer, output_bytes) = out.finish()?;
    reducer.shutdown(Shutdown::Write)?;
    Ok(Summary {
        input_bytes: streams.iter().map(|s| s.bytes_read()).sum(),
        input_records,
        output_bytes,
        output_records,
    })
}

fn serve(o: &Options) -> io::Result<()> {
    let listener = TcpListener::bind(&o.listen)?;
    loop {
        let mut mappers = Vec::with_capacity(o.mappers);
        while mappers.len() < o.mappers {
            let (conn, _) = listener.accept()?;
            mappers.push(conn);
        }
        let started = Instant::now();
        let result = TcpStream::connect(&o.connect).and_then(|reducer| combine(mappers, reducer));
        let s = match result {
            Ok(s) => s,
            // A broken group must not take the service down; --once is a
            // single measurement, so there the failure is the exit status.
            Err(e) if !o.once => {
                eprintln!("ifile-combiner: group failed: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        if !o.quiet {
            eprintln!(
                "ifile-combiner: {} records ({} bytes) in, {} records ({} bytes) out, {:.3} s",
                s.input_records,
                s.input_bytes,
                s.output_records,
                s.output_bytes,
                started.elapsed().as_secs_f64()
            );
        }
        if o.once {
            return Ok(());
        }
    }
}

fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("ifile-combiner: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match serve(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ifile-combiner: {e}");
            ExitCode::FAILURE
        }
    }
}
