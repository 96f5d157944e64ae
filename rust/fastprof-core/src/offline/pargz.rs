//! Parallel single-member gzip writer (pigz-style), used by `fastprof merge`.
//!
//! Trace viewers reject multi-member gzip, so concatenating independently
//! gzipped pieces is not an option. Instead the stream is cut into chunks and
//! each chunk is compressed on a worker thread as raw deflate ending in a sync
//! flush: its output ends on a byte boundary with no final block, so the pieces
//! concatenate, in order, into one deflate stream. The writer closes it with an
//! empty final block and wraps it in one gzip header and trailer; the trailer's
//! CRC-32 is the in-order combination of CRCs the workers computed per chunk.
//!
//! Like pigz, each chunk's window is primed with the last 32 KiB of the chunk
//! before it, so matches may reach back across chunk boundaries and the ratio
//! stays within a fraction of a percent of a serial encoder's.
//!
//! The calling thread does the ordering and the output I/O (in
//! [`ParGzWriter::write_chunk`] and [`ParGzWriter::finish`]); the workers only
//! compress. At most `2 * threads` chunks are queued, compressing or waiting to
//! be written, and `write_chunk` blocks beyond that, so memory stays bounded
//! whatever the producer's speed.

use flate2::{Compress, Compression, Crc, FlushCompress};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Chunk size of the [`Write`] adapter: large enough that the per-chunk costs
/// (a sync marker, a reset, 32 KiB of dictionary) vanish, small enough that
/// every worker gets work on modest inputs.
pub const CHUNK_SIZE: usize = 1 << 20;

/// Deflate's window: the most history a match can use, hence the dictionary.
const WINDOW: usize = 32 * 1024;

/// Magic, CM = deflate, FLG = 0, MTIME = 0; XFL and OS follow.
const GZIP_HEADER: [u8; 8] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0];
/// OS = 255, "unknown", as flate2's encoder writes it.
const GZIP_OS_UNKNOWN: u8 = 255;
/// BFINAL = 1, BTYPE = 01 (fixed Huffman), then the 7-bit end-of-block code.
const EMPTY_FINAL_BLOCK: [u8; 2] = [0x03, 0x00];

/// One chunk to compress, with the history it may refer back to.
struct Job {
    seq: u64,
    data: Vec<u8>,
    dict: Vec<u8>,
}

/// One compressed chunk: byte-aligned raw deflate, not final.
struct Done {
    deflate: Vec<u8>,
    crc: Crc,
}

type Outcome = (u64, io::Result<Done>);

/// Writes one single-member gzip stream, compressing chunks on `threads`
/// worker threads. See the module docs.
pub struct ParGzWriter {
    out: Box<dyn Write + Send>,
    /// `None` once shut down; dropping it lets idle workers exit.
    jobs: Option<Sender<Job>>,
    done: Receiver<Outcome>,
    workers: Vec<JoinHandle<()>>,
    /// Tells workers to skip what is still queued when the writer is dropped
    /// unfinished.
    cancel: Arc<AtomicBool>,
    /// Chunks allowed between submission and being written out.
    max_in_flight: u64,
    /// Sequence number of the next chunk submitted.
    next_seq: u64,
    /// Sequence number of the next chunk to write out.
    next_write: u64,
    /// Compressed chunks that arrived ahead of `next_write`.
    ready: BTreeMap<u64, Done>,
    /// The last `WINDOW` bytes submitted, the next chunk's dictionary.
    history: Vec<u8>,
    prime: bool,
    /// The [`Write`] adapter's partial chunk.
    buf: Vec<u8>,
    crc: Crc,
    total_in: u64,
    total_out: u64,
    /// The first error, replayed by every later call: after a failed write the
    /// output is unusable and must not be continued.
    failed: Option<(io::ErrorKind, String)>,
}

impl ParGzWriter {
    /// `out`: the destination (a File, usually a temp file), written only from
    /// the calling thread, in large pieces. `threads`: compression workers
    /// (0 is taken as 1). `level`: 0..=9 (0 stores, 1 is fastest).
    ///
    /// Writes the gzip header at once, so an unwritable `out` fails here.
    pub fn new(
        mut out: Box<dyn Write + Send>,
        threads: usize,
        level: u32,
    ) -> io::Result<ParGzWriter> {
        if level > 9 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("gzip level must be 0..=9, got {level}"),
            ));
        }
        let threads = threads.max(1);
        let xfl = match level {
            1 => 4,
            9 => 2,
            _ => 0,
        };
        out.write_all(&GZIP_HEADER)?;
        out.write_all(&[xfl, GZIP_OS_UNKNOWN])?;

        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (done_tx, done_rx) = mpsc::channel::<Outcome>();
        let cancel = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let (jobs, done, cancel) = (job_rx.clone(), done_tx.clone(), cancel.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("fastprof-gz-{i}"))
                .spawn(move || worker(&jobs, &done, &cancel, level));
            match spawned {
                Ok(handle) => workers.push(handle),
                // Fewer workers still make a valid stream; none cannot.
                Err(e) if workers.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        // The writer keeps no `done` sender: once every worker is gone, `recv`
        // fails instead of waiting forever.
        drop(done_tx);
        Ok(ParGzWriter {
            out,
            jobs: Some(job_tx),
            done: done_rx,
            max_in_flight: 2 * workers.len() as u64,
            workers,
            cancel,
            next_seq: 0,
            next_write: 0,
            ready: BTreeMap::new(),
            history: Vec::new(),
            prime: level > 0,
            buf: Vec::new(),
            crc: Crc::new(),
            total_in: 0,
            total_out: (GZIP_HEADER.len() + 2) as u64,
            failed: None,
        })
    }

    /// Queue a chunk of uncompressed bytes (any size; ~1 MiB works best).
    /// Chunks appear in the output in the order of the calls, after anything
    /// buffered by the [`Write`] adapter. Blocks while more than `2 * threads`
    /// chunks are in flight; writes out the chunks that are done.
    pub fn write_chunk(&mut self, data: Vec<u8>) -> io::Result<()> {
        self.check()?;
        let res = self.submit_buf().and_then(|()| self.submit(data));
        self.record(res)
    }

    /// Write everything, the final block and the trailer, and flush `out`.
    /// Returns (uncompressed bytes, compressed bytes including header and
    /// trailer). Dropping the writer instead abandons the stream, unfinished.
    pub fn finish(mut self) -> io::Result<(u64, u64)> {
        self.check()?;
        let res = self.finish_inner();
        self.record(res)?;
        Ok((self.total_in, self.total_out))
    }

    fn finish_inner(&mut self) -> io::Result<()> {
        self.submit_buf()?;
        self.pump(0)?;
        let mut tail = [0u8; EMPTY_FINAL_BLOCK.len() + 8];
        tail[..2].copy_from_slice(&EMPTY_FINAL_BLOCK);
        tail[2..6].copy_from_slice(&self.crc.sum().to_le_bytes());
        // ISIZE is the length modulo 2^32 by definition.
        tail[6..].copy_from_slice(&(self.total_in as u32).to_le_bytes());
        self.out.write_all(&tail)?;
        self.out.flush()?;
        self.total_out += tail.len() as u64;
        Ok(())
    }

    /// Replays the first error, if any.
    fn check(&self) -> io::Result<()> {
        match &self.failed {
            None => Ok(()),
            Some((kind, msg)) => Err(io::Error::new(
                *kind,
                format!("parallel gzip writer failed earlier: {msg}"),
            )),
        }
    }

    fn record<T>(&mut self, res: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &res {
            if self.failed.is_none() {
                self.failed = Some((e.kind(), e.to_string()));
            }
        }
        res
    }

    fn submit_buf(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::take(&mut self.buf);
        self.submit(data)
    }

    fn submit(&mut self, data: Vec<u8>) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let dict = if self.prime {
            let dict = self.history.clone();
            if data.len() >= WINDOW {
                self.history.clear();
                self.history.extend_from_slice(&data[data.len() - WINDOW..]);
            } else {
                self.history.extend_from_slice(&data);
                let excess = self.history.len().saturating_sub(WINDOW);
                self.history.drain(..excess);
            }
            dict
        } else {
            Vec::new()
        };
        self.total_in += data.len() as u64;
        let job = Job {
            seq: self.next_seq,
            data,
            dict,
        };
        let sent = self.jobs.as_ref().map(|tx| tx.send(job).is_ok());
        if sent != Some(true) {
            return Err(workers_gone());
        }
        self.next_seq += 1;
        self.pump(self.max_in_flight)
    }

    /// Writes out, in order, every chunk that is done; waits for more until at
    /// most `limit` chunks are in flight.
    fn pump(&mut self, limit: u64) -> io::Result<()> {
        loop {
            while let Ok((seq, res)) = self.done.try_recv() {
                self.ready.insert(seq, res?);
            }
            while let Some(done) = self.ready.remove(&self.next_write) {
                self.out.write_all(&done.deflate)?;
                self.total_out += done.deflate.len() as u64;
                self.crc.combine(&done.crc);
                self.next_write += 1;
            }
            if self.next_seq - self.next_write <= limit {
                return Ok(());
            }
            let (seq, res) = self.done.recv().map_err(|_| workers_gone())?;
            self.ready.insert(seq, res?);
        }
    }

    /// Stops the workers; chunks still queued are not compressed.
    fn shutdown(&mut self) {
        // Relaxed: only a hint to skip useless work. Workers see it at the
        // latest after the channel disconnect below, which `recv` orders.
        self.cancel.store(true, Ordering::Relaxed);
        self.jobs = None;
        for handle in self.workers.drain(..) {
            // A worker catches its compression panics, so join can only fail
            // on a bug in the loop itself; nothing is left to clean up then.
            let _ = handle.join();
        }
    }
}

impl Write for ParGzWriter {
    /// Buffers into [`CHUNK_SIZE`] chunks.
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.check()?;
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(CHUNK_SIZE);
        }
        let n = data.len().min(CHUNK_SIZE - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK_SIZE {
            let res = self.submit_buf();
            self.record(res)?;
        }
        Ok(n)
    }

    /// Submits the partial chunk, writes out everything in flight and flushes
    /// `out`: what is on disk then decodes up to this point. Each flush ends a
    /// chunk, so flushing often costs ratio and parallelism.
    fn flush(&mut self) -> io::Result<()> {
        self.check()?;
        let res = self
            .submit_buf()
            .and_then(|()| self.pump(0))
            .and_then(|()| self.out.flush());
        self.record(res)
    }
}

impl Drop for ParGzWriter {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn workers_gone() -> io::Error {
    io::Error::other("parallel gzip: compression workers are gone")
}

fn worker(jobs: &Mutex<Receiver<Job>>, done: &Sender<Outcome>, cancel: &AtomicBool, level: u32) {
    let mut deflate = Compress::new(Compression::new(level), false);
    loop {
        // Holding the lock while blocked in `recv` is the point: one idle
        // worker waits on the channel, the others on the lock. A poisoned lock
        // still guards a valid receiver.
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(poisoned) => poisoned.into_inner().recv(),
        };
        let Ok(job) = job else { return };
        if cancel.load(Ordering::Relaxed) {
            return;
        }
        let res = panic::catch_unwind(AssertUnwindSafe(|| {
            compress_chunk(&mut deflate, &job.data, &job.dict)
        }));
        let res = res.unwrap_or_else(|_| {
            // The stream state may be half-updated: start afresh.
            deflate = Compress::new(Compression::new(level), false);
            Err(io::Error::other("parallel gzip: compression panicked"))
        });
        if done.send((job.seq, res)).is_err() {
            return;
        }
    }
}

/// Compresses `data` as raw deflate ending in a sync flush: byte-aligned, no
/// final block, so it can be followed by the next chunk's output.
fn compress_chunk(deflate: &mut Compress, data: &[u8], dict: &[u8]) -> io::Result<Done> {
    let err = |e: flate2::CompressError| io::Error::other(format!("deflate: {e}"));
    deflate.reset();
    if !dict.is_empty() {
        deflate.set_dictionary(dict).map_err(err)?;
    }
    // deflateBound is ~len + len/4096 + a few bytes; the sync marker adds 5.
    let mut out = Vec::with_capacity(data.len() + data.len() / 1024 + 64);
    let start = deflate.total_in();
    loop {
        let pos = (deflate.total_in() - start) as usize;
        deflate
            .compress_vec(&data[pos..], &mut out, FlushCompress::Sync)
            .map_err(err)?;
        // zlib's rule: the flush is complete once it returns with output
        // space left over.
        let pos = (deflate.total_in() - start) as usize;
        if pos == data.len() && out.len() < out.capacity() {
            break;
        }
        out.reserve(out.capacity().max(4096));
    }
    let mut crc = Crc::new();
    crc.update(data);
    Ok(Done { deflate: out, crc })
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::{GzDecoder, MultiGzDecoder};
    use std::fmt::Write as _;
    use std::io::{Cursor, Read};
    use std::time::Instant;

    /// An output the test can read back after the writer took it.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn bytes(&self) -> Vec<u8> {
            self.0.lock().unwrap().clone()
        }
    }

    /// Accepts `left` bytes, then fails every write.
    struct FailAfter {
        left: usize,
    }

    impl Write for FailAfter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.left == 0 {
                return Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"));
            }
            let n = buf.len().min(self.left);
            self.left -= n;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            // xorshift64*
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    /// Half noise, half repeats: exercises stored-ish and matchy blocks.
    fn random_ish(len: usize, seed: u64) -> Vec<u8> {
        let mut rng = Rng(seed | 1);
        let mut v = Vec::with_capacity(len);
        while v.len() < len {
            let r = rng.next();
            if r % 3 == 0 && v.len() > 300 {
                let back = (r >> 8) as usize % 300 + 1;
                let n = ((r >> 24) as usize % 40 + 3).min(len - v.len());
                let start = v.len() - back;
                for i in 0..n {
                    v.push(v[start + i]);
                }
            } else {
                let n = 8.min(len - v.len());
                v.extend_from_slice(&r.to_le_bytes()[..n]);
            }
        }
        v
    }

    /// Synthetic Chrome-trace events, the workload of `fastprof merge`.
    fn json_like(len: usize, seed: u64) -> Vec<u8> {
        const NAMES: [&str; 6] = [
            "aten::mm",
            "aten::add_",
            "forward",
            "DataLoader.__next__",
            "cudaLaunchKernel",
            "optimizer.step",
        ];
        let mut rng = Rng(seed | 1);
        let mut s = String::with_capacity(len + 256);
        s.push_str("{\"traceEvents\":[\n");
        let mut ts = 1_700_000_000_000u64;
        while s.len() < len {
            let r = rng.next();
            ts += r % 5000;
            let _ = writeln!(
                s,
                "{{\"name\":\"{}\",\"ph\":\"X\",\"ts\":{}.{:03},\"dur\":{}.{:03},\"pid\":{},\"tid\":{},\"cat\":\"cpu_op\",\"args\":{{\"seq\":{}}}}},",
                NAMES[(r >> 8) as usize % NAMES.len()],
                ts / 1000,
                ts % 1000,
                (r >> 16) % 900,
                (r >> 24) % 1000,
                4000 + (r >> 40) % 4,
                4100 + (r >> 44) % 16,
                r >> 50,
            );
        }
        let mut v = s.into_bytes();
        v.truncate(len);
        v
    }

    fn compress(data: &[u8], threads: usize, level: u32, chunk: usize) -> Vec<u8> {
        let out = Shared::default();
        let mut w = ParGzWriter::new(Box::new(out.clone()), threads, level).unwrap();
        for piece in data.chunks(chunk.max(1)) {
            w.write_chunk(piece.to_vec()).unwrap();
        }
        let (n_in, n_out) = w.finish().unwrap();
        let gz = out.bytes();
        assert_eq!(n_in, data.len() as u64);
        assert_eq!(n_out, gz.len() as u64);
        gz
    }

    /// Decodes as exactly one member that ends where the bytes end.
    fn check_single_member(gz: &[u8], data: &[u8]) {
        let mut cur = Cursor::new(gz);
        let mut got = Vec::with_capacity(data.len());
        GzDecoder::new(&mut cur).read_to_end(&mut got).unwrap();
        assert!(
            got == data,
            "round trip differs ({} vs {} bytes)",
            got.len(),
            data.len()
        );
        assert_eq!(
            cur.position(),
            gz.len() as u64,
            "bytes left after one member"
        );
        let mut multi = Vec::with_capacity(data.len());
        MultiGzDecoder::new(gz).read_to_end(&mut multi).unwrap();
        assert!(multi == data);
    }

    #[test]
    fn round_trip_sizes_threads_chunks() {
        for len in [0usize, 1, 1000, 3 * 1024 * 1024 + 17] {
            for (kind, data) in [("random", random_ish(len, 7)), ("json", json_like(len, 9))] {
                for (i, threads) in [1, 2, 4].into_iter().enumerate() {
                    let chunks = if len > CHUNK_SIZE {
                        // One size per thread count: debug-built zlib-rs is slow.
                        vec![[64 * 1024 + 3, CHUNK_SIZE, 5 * CHUNK_SIZE][i]]
                    } else {
                        vec![7, 1000, CHUNK_SIZE]
                    };
                    for chunk in chunks {
                        let gz = compress(&data, threads, 1, chunk);
                        eprintln!("{kind} {len} t{threads} c{chunk}: {} bytes", gz.len());
                        check_single_member(&gz, &data);
                    }
                }
            }
        }
    }

    #[test]
    fn round_trip_20_mib() {
        let len = 20 * 1024 * 1024;
        for (data, threads, chunk) in [
            (json_like(len, 3), 4, CHUNK_SIZE),
            (random_ish(len, 5), 2, 3 * CHUNK_SIZE + 1),
        ] {
            check_single_member(&compress(&data, threads, 1, chunk), &data);
        }
    }

    #[test]
    fn levels_and_write_adapter() {
        let data = json_like(2 * CHUNK_SIZE + 12345, 11);
        for level in [0, 6, 9] {
            let out = Shared::default();
            let mut w = ParGzWriter::new(Box::new(out.clone()), 2, level).unwrap();
            // Odd-sized writes, a mid-stream flush, then a direct chunk: the
            // adapter's buffer must go out before it.
            let (a, b) = data.split_at(CHUNK_SIZE + 999);
            for piece in a.chunks(4097) {
                w.write_all(piece).unwrap();
            }
            w.flush().unwrap();
            check_prefix(&out.bytes(), a);
            w.write_all(&b[..10]).unwrap();
            w.write_chunk(b[10..].to_vec()).unwrap();
            w.finish().unwrap();
            check_single_member(&out.bytes(), &data);
        }
        assert!(ParGzWriter::new(Box::new(io::sink()), 1, 10).is_err());
    }

    /// After `flush`, what was written decodes up to the flushed point.
    fn check_prefix(gz: &[u8], want: &[u8]) {
        let mut got = Vec::new();
        let mut dec = GzDecoder::new(gz);
        let mut buf = [0u8; 65536];
        loop {
            match dec.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        assert!(
            got == want,
            "flushed prefix: {} of {} bytes",
            got.len(),
            want.len()
        );
    }

    #[test]
    fn gzip_command_accepts_output() {
        if std::process::Command::new("gzip")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("no gzip command: skipped");
            return;
        }
        let data = json_like(3 * CHUNK_SIZE + 17, 13);
        let gz = compress(&data, 3, 1, CHUNK_SIZE);
        let path =
            std::env::temp_dir().join(format!("fastprof-pargz-{}.json.gz", std::process::id()));
        std::fs::write(&path, &gz).unwrap();
        let test = std::process::Command::new("gzip")
            .arg("-t")
            .arg(&path)
            .output()
            .unwrap();
        let dec = std::process::Command::new("gzip")
            .arg("-dc")
            .arg(&path)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(
            test.status.success(),
            "gzip -t: {}",
            String::from_utf8_lossy(&test.stderr)
        );
        assert!(dec.status.success() && dec.stderr.is_empty());
        assert!(dec.stdout == data);
    }

    #[test]
    fn output_errors_propagate() {
        assert!(ParGzWriter::new(Box::new(FailAfter { left: 3 }), 2, 1).is_err());
        let data = random_ish(16 * CHUNK_SIZE, 17);
        for (threads, left) in [(1, 10), (2, 5000), (4, 3 * CHUNK_SIZE)] {
            let mut w = ParGzWriter::new(Box::new(FailAfter { left }), threads, 1).unwrap();
            let mut first_err = None;
            for piece in data.chunks(CHUNK_SIZE) {
                if let Err(e) = w.write_chunk(piece.to_vec()) {
                    first_err = Some(e);
                    break;
                }
            }
            match first_err {
                Some(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::StorageFull);
                    // Poisoned: every later call fails the same way.
                    let again = w.write_chunk(vec![1; 10]).unwrap_err();
                    assert_eq!(again.kind(), io::ErrorKind::StorageFull);
                    assert!(w.write(b"x").is_err());
                    assert!(w.finish().is_err());
                }
                None => assert!(w.finish().is_err()),
            }
        }
        // A failure in the trailer only.
        let full = compress(b"abc", 1, 1, 3).len();
        let mut w = ParGzWriter::new(Box::new(FailAfter { left: full - 4 }), 1, 1).unwrap();
        w.write_chunk(b"abc".to_vec()).unwrap();
        assert!(w.finish().is_err());
    }

    #[test]
    fn drop_without_finish() {
        let data = json_like(8 * CHUNK_SIZE, 19);
        let out = Shared::default();
        let mut w = ParGzWriter::new(Box::new(out), 2, 1).unwrap();
        for piece in data.chunks(CHUNK_SIZE) {
            w.write_chunk(piece.to_vec()).unwrap();
        }
        w.write_all(b"partial").unwrap();
        drop(w);
    }

    /// `cargo test --release -p fastprof-core pargz -- --ignored --nocapture`
    #[test]
    #[ignore = "benchmark: 200 MB, run in release"]
    fn throughput_vs_single_thread() {
        let data = json_like(200_000_000, 23);
        let mb = data.len() as f64 / 1e6;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());

        let t = Instant::now();
        let out = Shared::default();
        let mut w = ParGzWriter::new(Box::new(out.clone()), threads, 1).unwrap();
        for piece in data.chunks(CHUNK_SIZE) {
            w.write_chunk(piece.to_vec()).unwrap();
        }
        let (_, par_out) = w.finish().unwrap();
        let par_s = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), Compression::new(1));
        enc.write_all(&data).unwrap();
        let single = enc.finish().unwrap();
        let single_s = t.elapsed().as_secs_f64();

        println!(
            "parallel ({threads} threads): {:.0} MB/s, ratio {:.2}%",
            mb / par_s,
            100.0 * par_out as f64 / data.len() as f64
        );
        println!(
            "single GzEncoder:        {:.0} MB/s, ratio {:.2}%",
            mb / single_s,
            100.0 * single.len() as f64 / data.len() as f64
        );
        check_single_member(&out.bytes(), &data);
    }
}
