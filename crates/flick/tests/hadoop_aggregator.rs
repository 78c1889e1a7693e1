//! Listing 3's Hadoop aggregator run by `flick run`: mappers connect and
//! send sorted IFile streams, `foldt` merges them and sums equal keys, and
//! the reducer connection gets one sorted IFile stream with the end marker
//! and the CRC32 that Hadoop's `IFile.Reader` checks.

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::{Procs, ROOT};

/// `WritableUtils.writeVLong`.
fn vlong(out: &mut Vec<u8>, v: i64) {
    if (-112..=127).contains(&v) {
        out.push(v as u8);
        return;
    }
    let (mut i, mut len) = (v, -112i32);
    if i < 0 {
        i = !i;
        len = -120;
    }
    let mut tmp = i;
    while tmp != 0 {
        tmp >>= 8;
        len -= 1;
    }
    out.push(len as u8);
    let n = if len < -120 {
        -(len + 120)
    } else {
        -(len + 112)
    };
    for idx in (0..n).rev() {
        out.push((i >> (8 * idx)) as u8);
    }
}

/// `WritableUtils.readVLong`; `None` at the end of the bytes.
fn read_vlong(b: &[u8], at: &mut usize) -> Option<i64> {
    let first = *b.get(*at)? as i8;
    *at += 1;
    if first >= -112 {
        return Some(first as i64);
    }
    let negative = first < -120;
    let n = if negative {
        -119 - first as i32
    } else {
        -111 - first as i32
    } as usize;
    let mut v: i64 = 0;
    for _ in 1..n {
        v = (v << 8) | *b.get(*at)? as i64;
        *at += 1;
    }
    Some(if negative { !v } else { v })
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// An IFile of (Text, IntWritable) records, as `IFile.Writer` writes it.
fn ifile(records: &[(String, i32)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in records {
        let mut key = Vec::new();
        vlong(&mut key, k.len() as i64);
        key.extend_from_slice(k.as_bytes());
        vlong(&mut out, key.len() as i64);
        vlong(&mut out, 4);
        out.extend_from_slice(&key);
        out.extend_from_slice(&v.to_be_bytes());
    }
    vlong(&mut out, -1);
    vlong(&mut out, -1);
    let sum = crc32(&out);
    out.extend_from_slice(&sum.to_be_bytes());
    out
}

/// Reads an IFile of (Text, IntWritable) records the way `IFile.Reader`
/// does: records until the end marker, then the CRC32 of all before it.
fn read_ifile(b: &[u8]) -> Result<Vec<(String, i32)>, String> {
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        let k = read_vlong(b, &mut at).ok_or("truncated key length")?;
        let v = read_vlong(b, &mut at).ok_or("truncated value length")?;
        if k == -1 && v == -1 {
            break;
        }
        if v != 4 || k < 1 {
            return Err(format!("bad lengths {k}, {v} at {at}"));
        }
        let key = b.get(at..at + k as usize).ok_or("truncated key")?;
        let mut t = 0;
        let n = read_vlong(key, &mut t).ok_or("bad Text")? as usize;
        if t + n != key.len() {
            return Err("Text does not fill the key".into());
        }
        let word = String::from_utf8(key[t..].to_vec()).map_err(|e| e.to_string())?;
        at += k as usize;
        let value = b.get(at..at + 4).ok_or("truncated value")?;
        out.push((word, i32::from_be_bytes(value.try_into().unwrap())));
        at += 4;
    }
    let sum = b.get(at..at + 4).ok_or("no checksum")?;
    if u32::from_be_bytes(sum.try_into().unwrap()) != crc32(&b[..at]) {
        return Err("checksum mismatch".into());
    }
    if at + 4 != b.len() {
        return Err(format!("{} bytes after the checksum", b.len() - at - 4));
    }
    Ok(out)
}

/// Word-count map output of `words`, one record per occurrence, sorted.
fn map_output(words: &[String]) -> Vec<(String, i32)> {
    let mut w: Vec<(String, i32)> = words.iter().map(|w| (w.clone(), 1)).collect();
    w.sort();
    w
}

/// Starts the aggregator with `mappers` mapper connections per instance,
/// writing to `reducer`; returns the port the mappers connect to.
fn start(procs: &mut Procs, mappers: usize, reducer: u16) -> u16 {
    start_program(procs, "examples/hadoop_wordcount.flick", mappers, reducer)
}

/// Starts `program` (a path from the repository root, or absolute) as
/// [`start`] starts the aggregator.
fn start_program(procs: &mut Procs, program: &str, mappers: usize, reducer: u16) -> u16 {
    let fan_in = format!("mappers={mappers}");
    let listen = format!("mappers=127.0.0.1:{}", support::free_port());
    let reducer = format!("reducer=127.0.0.1:{reducer}");
    support::start_flick(
        procs,
        &[
            "run",
            program,
            "--listen",
            &listen,
            "--fan-in",
            &fan_in,
            "--connect",
            &reducer,
        ],
    )
}

/// Accepts the reducer's connection on `reducer` and reads all of it.
fn receive(reducer: std::net::TcpListener) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let (mut s, _) = reducer.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        all
    })
}

/// Sends each mapper's stream on its own connection, in pieces, and
/// returns everything the reducer receives.
fn aggregate(streams: Vec<Vec<u8>>) -> Vec<u8> {
    aggregate_with("examples/hadoop_wordcount.flick", streams)
}

/// [`aggregate`] through `program`.
fn aggregate_with(program: &str, streams: Vec<Vec<u8>>) -> Vec<u8> {
    let reducer = support::listener();
    let rport = reducer.local_addr().unwrap().port();
    let mut procs = Procs(Vec::new());
    let port = start_program(&mut procs, program, streams.len(), rport);
    let received = receive(reducer);
    let senders: Vec<_> = streams
        .into_iter()
        .map(|bytes| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            std::thread::spawn(move || {
                // Odd-sized pieces: records split across reads.
                for piece in bytes.chunks(1000 + 7) {
                    s.write_all(piece).unwrap();
                }
                s
            })
        })
        .collect();
    let conns: Vec<TcpStream> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    let out = received.join().unwrap();
    drop(conns);
    out
}

fn words(seed: u64, n: usize, vocabulary: &[String]) -> Vec<String> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            vocabulary[(x % vocabulary.len() as u64) as usize].clone()
        })
        .collect()
}

#[test]
fn mapper_streams_are_merged_by_key_and_summed_into_one_ifile() {
    // Words of 8, 12 and 16 letters, repeated within and across mappers.
    let vocabulary: Vec<String> = (0..300)
        .map(|i| {
            let len = [8, 12, 16][i % 3];
            (0..len)
                .map(|j| (b'a' + ((i * 7 + j * 13) % 26) as u8) as char)
                .collect()
        })
        .collect();
    let mut expected: BTreeMap<String, i32> = BTreeMap::new();
    let mut streams = Vec::new();
    for m in 0..4u64 {
        let ws = words(m * 7919 + 1, 3000, &vocabulary);
        for w in &ws {
            *expected.entry(w.clone()).or_default() += 1;
        }
        streams.push(ifile(&map_output(&ws)));
    }
    let out = aggregate(streams);
    let records = read_ifile(&out).unwrap_or_else(|e| panic!("{e}: {} bytes", out.len()));
    let got: Vec<(String, i32)> = records.clone();
    let want: Vec<(String, i32)> = expected.into_iter().collect();
    assert_eq!(got.len(), want.len());
    assert_eq!(
        got, want,
        "sorted by key, one record per word, counts summed"
    );
}

/// The word count's fold body runs natively (compiled when the program
/// loads); the same body with a line the compiler leaves to the
/// interpreter runs the interpreted loop. Both give the same bytes: sums
/// that overflow wrap as an IntWritable does, and keys long enough to lie
/// across the chunks a stream is read in are merged whole.
#[test]
fn native_and_interpreted_folds_give_the_same_stream() {
    let src = std::fs::read_to_string(format!("{}/examples/hadoop_wordcount.flick", support::ROOT))
        .unwrap();
    let interpreted = src.replace(
        "        let v = combine(e1.value, e2.value)\n",
        "        let v = combine(e1.value, e2.value)\n        let bigger = e1.value > e2.value\n",
    );
    assert_ne!(src, interpreted);
    let path = std::env::temp_dir().join(format!(
        "flick-interpreted-fold-{}.flick",
        std::process::id()
    ));
    std::fs::write(&path, interpreted).unwrap();
    let long = |c: char, n: usize| std::iter::repeat_n(c, n).collect::<String>();
    let mut keys: Vec<String> = (0..40).map(|i| format!("key{i:03}")).collect();
    keys.push(long('m', 70_000 / 2));
    keys.push(long('n', 200));
    keys.push(long('z', 40_000));
    keys.sort();
    let streams: Vec<Vec<u8>> = (0..3)
        .map(|m| {
            let mut records = Vec::new();
            for (i, k) in keys.iter().enumerate() {
                for r in 0..(i + m) % 5 {
                    let v = match (i + r) % 3 {
                        0 => i32::MAX - r as i32,
                        1 => i32::MIN + 7,
                        _ => (i * 31 + r) as i32,
                    };
                    records.push((k.clone(), v));
                }
            }
            ifile(&records)
        })
        .collect();
    let native = aggregate(streams.clone());
    let interpreted = aggregate_with(path.to_str().unwrap(), streams.clone());
    let _ = std::fs::remove_file(&path);
    let records = read_ifile(&native).unwrap();
    assert_eq!(native, interpreted);
    // IntWritable sums: 32-bit two's complement.
    let mut want: BTreeMap<String, i32> = BTreeMap::new();
    for s in &streams {
        for (k, v) in read_ifile(s).unwrap() {
            let e = want.entry(k).or_default();
            *e = e.wrapping_add(v);
        }
    }
    assert_eq!(records, want.into_iter().collect::<Vec<_>>());
}

#[test]
fn one_mapper_with_nothing_still_gives_a_valid_empty_stream() {
    let out = aggregate(vec![ifile(&[]), ifile(&map_output(&["abcdefgh".into()]))]);
    assert_eq!(read_ifile(&out).unwrap(), vec![("abcdefgh".to_string(), 1)]);
}

/// Hadoop's own classes on both ends: `IFile.Writer` writes 8 mappers'
/// word-count output (interop/hadoop), the aggregator merges it, and
/// `IFile.Reader` reads the reducer's stream (checking its CRC32) and
/// checks every count against a count of the generated text.
#[test]
fn hadoops_ifile_reader_accepts_the_aggregated_stream() {
    let build = Command::new(format!("{ROOT}/interop/hadoop/build.sh"))
        .stdin(Stdio::null())
        .output()
        .expect("interop/hadoop/build.sh runs (needs Java 17 and Maven)");
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let jar = String::from_utf8(build.stdout).unwrap().trim().to_string();
    let dir = std::env::temp_dir().join(format!("flick-hadoop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let java = |args: &[&str]| {
        let o = Command::new("java")
            .args(["-jar", &jar])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status.success(), text)
    };
    let d = dir.to_str().unwrap();
    let (ok, out) = java(&[
        "generate",
        "--mappers",
        "8",
        "--words",
        "200000",
        "--seed",
        "42",
        "--out",
        d,
    ]);
    assert!(ok, "{out}");
    let streams: Vec<Vec<u8>> = (0..8)
        .map(|i| std::fs::read(dir.join(format!("mapper-{i}.ifile"))).unwrap())
        .collect();
    let aggregated = aggregate(streams);
    let flick_out = dir.join("flick.ifile");
    std::fs::write(&flick_out, &aggregated).unwrap();
    let expected = dir.join("expected.tsv");
    let (ok, out) = java(&[
        "verify",
        "--in",
        flick_out.to_str().unwrap(),
        "--expected",
        expected.to_str().unwrap(),
    ]);
    assert!(ok, "IFile.Reader rejects Flick's stream: {out}");
    assert!(out.contains("records=3000"), "{out}");
    // The same bytes as Hadoop's writer gives for the same merge.
    let reference = dir.join("merged.ifile");
    let mut args = vec!["merge", "--out", reference.to_str().unwrap()];
    let inputs: Vec<String> = (0..8)
        .map(|i| dir.join(format!("mapper-{i}.ifile")).display().to_string())
        .collect();
    args.extend(inputs.iter().map(String::as_str));
    let (ok, out) = java(&args);
    assert!(ok, "{out}");
    assert_eq!(aggregated, std::fs::read(&reference).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts the aggregator (two mappers) in front of `reducer`, trying an
/// unreachable reducer for `connect_ms`.
fn start_trying(procs: &mut Procs, reducer: u16, connect_ms: u64) -> u16 {
    let listen = format!("mappers=127.0.0.1:{}", support::free_port());
    let reducer = format!("reducer=127.0.0.1:{reducer}");
    let connect_ms = connect_ms.to_string();
    support::start_flick(
        procs,
        &[
            "run",
            "examples/hadoop_wordcount.flick",
            "--listen",
            &listen,
            "--fan-in",
            "mappers=2",
            "--connect",
            &reducer,
            "--connect-timeout-ms",
            &connect_ms,
        ],
    )
}

/// A reducer that stays unreachable past `--connect-timeout-ms` fails the
/// job visibly (a log line, `jobs_failed`): the mappers' connections end
/// without an answer, and the aggregator stays up for the next job.
#[test]
fn an_unreachable_reducer_fails_the_job_after_the_connect_timeout() {
    let nobody = support::free_port();
    let mut procs = Procs(Vec::new());
    let port = start_trying(&mut procs, nobody, 300);
    for _round in 0..2 {
        let mut mappers: Vec<TcpStream> = (0..2)
            .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
            .collect();
        let started = std::time::Instant::now();
        for m in &mut mappers {
            m.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            // Records, but not the end of the stream: the mapper goes on.
            let stream = ifile(&map_output(&["abcdefgh".into()]));
            // The write may fail once the aggregator has aborted: either is fine.
            let _ = m.write_all(&stream[..stream.len() - 6]);
        }
        for m in &mut mappers {
            let mut buf = [0u8; 16];
            match m.read(&mut buf) {
                Ok(0) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                other => panic!("the mapper's connection stays open: {other:?}"),
            }
        }
        // Tried for the connect timeout first, with backoff.
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "aborted after {:?}, before the connect timeout",
            started.elapsed()
        );
    }
}

/// A reducer that comes up while the job waits for it gets the whole
/// aggregated stream: the aggregator tries it again with backoff, and the
/// mappers' streams wait on their connections meanwhile.
#[test]
fn a_reducer_that_comes_up_late_gets_the_job() {
    let rport = support::free_port();
    let mut procs = Procs(Vec::new());
    let port = start_trying(&mut procs, rport, 10_000);
    let ws: Vec<String> = ["alpha", "bravo", "charlie"].map(String::from).to_vec();
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let bytes = ifile(&map_output(&ws));
            std::thread::spawn(move || {
                s.write_all(&bytes).unwrap();
                s
            })
        })
        .collect();
    // The job is waiting for its reducer now.
    std::thread::sleep(Duration::from_millis(700));
    let reducer = std::net::TcpListener::bind(("127.0.0.1", rport)).unwrap();
    let received = receive(reducer);
    let conns: Vec<TcpStream> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    let out = received.join().unwrap();
    drop(conns);
    let got = read_ifile(&out).unwrap_or_else(|e| panic!("{e}: {} bytes", out.len()));
    let want: Vec<(String, i32)> = ws.iter().map(|w| (w.clone(), 2)).collect();
    assert_eq!(got, want);
}

/// How a hostile mapper ends its stream.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// Its connection closes after the bytes.
    Close,
    /// Its connection is reset after the bytes.
    Reset,
}

/// Three mappers: two send good streams, one sends `bad` and ends as
/// `ending` says. Returns what the reducer got (all of it, up to its end
/// or a reset) and whether each mapper's connection was closed or reset
/// by the aggregator, within 10 s.
fn aggregate_with_a_hostile_mapper(bad: Vec<u8>, ending: Ending) -> (Vec<u8>, Vec<bool>) {
    let reducer = support::listener();
    let rport = reducer.local_addr().unwrap().port();
    let mut procs = Procs(Vec::new());
    let port = start(&mut procs, 3, rport);
    let received = std::thread::spawn(move || {
        let (mut s, _) = reducer.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("the reducer's connection neither ended nor reset: {e}"),
            }
        }
        all
    });
    let good = |seed: u64| {
        ifile(&map_output(&words(
            seed,
            200,
            &["alpha".into(), "beta".into(), "gamma".into()],
        )))
    };
    let streams = [good(1), bad, good(2)];
    let mut conns: Vec<TcpStream> = Vec::new();
    for (i, bytes) in streams.iter().enumerate() {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        // The aggregator may have closed already: a failed write is fine.
        let _ = s.write_all(bytes);
        if i == 1 {
            match ending {
                Ending::Close => {
                    let _ = s.shutdown(std::net::Shutdown::Write);
                }
                Ending::Reset => {
                    socket2::SockRef::from(&s)
                        .set_linger(Some(Duration::ZERO))
                        .unwrap();
                    drop(s);
                    continue;
                }
            }
        }
        conns.push(s);
    }
    let out = received.join().unwrap();
    let ended: Vec<bool> = conns
        .iter_mut()
        .map(|c| {
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut rest = Vec::new();
            match c.read_to_end(&mut rest) {
                Ok(_) => true,
                Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            }
        })
        .collect();
    (out, ended)
}

/// A mapper's stream that is truncated, reset, without its end marker,
/// with a wrong CRC, out of key order, or garbage fails the job: the
/// reducer never gets a well-formed stream (Hadoop's reader, like
/// `read_ifile`, fails on it), and every mapper's connection ends.
#[test]
fn a_hostile_mapper_fails_the_job_visibly() {
    let good = ifile(&map_output(&words(
        9,
        200,
        &["delta".into(), "omega".into()],
    )));
    let records_only = good[..good.len() - 6].to_vec();
    let mut bad_crc = good.clone();
    *bad_crc.last_mut().unwrap() ^= 0x55;
    let unsorted = ifile(&[("zeta".into(), 1), ("alpha".into(), 1)]);
    let garbage: Vec<u8> = (0..500u32).map(|i| (i * 131 % 251) as u8).collect();
    let cases: Vec<(&str, Vec<u8>, Ending)> = vec![
        (
            "truncated mid-record",
            good[..good.len() / 2].to_vec(),
            Ending::Close,
        ),
        (
            "reset mid-record",
            good[..good.len() / 2].to_vec(),
            Ending::Reset,
        ),
        ("no end marker", records_only, Ending::Close),
        ("a wrong CRC", bad_crc, Ending::Close),
        ("keys out of order", unsorted, Ending::Close),
        ("garbage", garbage, Ending::Close),
    ];
    for (what, bytes, ending) in cases {
        let (out, ended) = aggregate_with_a_hostile_mapper(bytes, ending);
        assert!(
            read_ifile(&out).is_err(),
            "{what}: the reducer got a well-formed stream of {} bytes",
            out.len()
        );
        assert!(
            ended.iter().all(|e| *e),
            "{what}: mappers' connections {ended:?}"
        );
    }
}

/// A fan-in group that does not fill within `--fan-in-timeout-ms` fails:
/// its mappers' connections end, and the next job's connections make a
/// group of their own, so the reducer gets that job's words only.
#[test]
fn a_group_that_never_fills_times_out_and_mixes_no_jobs() {
    let reducer = support::listener();
    let rport = reducer.local_addr().unwrap().port();
    let mut procs = Procs(Vec::new());
    let listen = format!("mappers=127.0.0.1:{}", support::free_port());
    let connect = format!("reducer=127.0.0.1:{rport}");
    let port = support::start_flick(
        &mut procs,
        &[
            "run",
            "examples/hadoop_wordcount.flick",
            "--listen",
            &listen,
            "--fan-in",
            "mappers=3",
            "--connect",
            &connect,
            "--fan-in-timeout-ms",
            "300",
        ],
    );
    let stream = |words: &[&str]| {
        let w: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        ifile(&map_output(&w))
    };
    // Job A: two of its three mappers come; the third never does.
    let mut lonely: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(&stream(&["stale"])).unwrap();
            s
        })
        .collect();
    for s in &mut lonely {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest = Vec::new();
        match s.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
    // Job B: three mappers, one group of its own.
    let received = receive(reducer);
    let mappers: Vec<TcpStream> = [["fresh", "word"], ["fresh", "fresh"], ["word", "zebra"]]
        .iter()
        .map(|words| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(&stream(words)).unwrap();
            s
        })
        .collect();
    let out = received.join().unwrap();
    drop(mappers);
    assert_eq!(
        read_ifile(&out).unwrap(),
        vec![
            ("fresh".to_string(), 3),
            ("word".to_string(), 2),
            ("zebra".to_string(), 1)
        ]
    );
}
