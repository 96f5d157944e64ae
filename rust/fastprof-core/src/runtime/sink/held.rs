//! A file written for a session beside its sinks, within disk held under
//! the cap while it grows: a torch.profiler window's gzip, from the JSON
//! Kineto streams into a pipe (so that neither the JSON nor the gzip ever
//! takes disk the cap has not made room for). The segment sink holds what
//! is asked ([`Sink::hold`](super::Sink::hold)), deleting the oldest files
//! for it as it would for a file once written; the caller counts the file
//! with [`Session::count_file_held`](crate::runtime::session::Session::count_file_held),
//! which releases the hold as the file takes its place.

use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::{self, Read, Write};
use std::path::Path;

/// Asks the disk cap for more room.
pub trait Hold {
    /// Hold `bytes` more for the file being written; false when the cap
    /// cannot leave them beside the open segment.
    fn hold(&self, bytes: u64) -> bool;
    /// The byte cap (0: none, every hold is granted).
    fn max_disk(&self) -> u64;
}

/// What [`gzip_held`] did.
#[derive(Debug, Default)]
pub struct Copied {
    /// Bytes of the gzip file (0 when not written).
    pub bytes: u64,
    /// Bytes read from the source.
    pub raw: u64,
    /// Bytes held under the cap for it, to release once it is counted or gone.
    pub held: u64,
    /// Why no file was written (the cap, or an I/O error); the file is then removed.
    pub error: Option<String>,
    /// Whether that was the cap's refusal (not an I/O error).
    pub refused: bool,
}

/// Gzip `src` into `dst` (one member at `level`), holding disk in steps
/// before the file grows past what is held. When the cap refuses, or
/// writing fails, `dst` is removed and `src` is still read to its end: the
/// writer on the other side of a pipe is never left blocked.
pub fn gzip_held(src: &mut dyn Read, dst: &Path, level: u32, hold: &dyn Hold) -> Copied {
    let mut out = Copied::default();
    let file = match std::fs::File::create(dst) {
        Ok(f) => f,
        Err(e) => {
            out.error = Some(format!("{}: {e}", dst.display()));
            out.raw = drain(src);
            return out;
        }
    };
    // A few dozen holds for a file the size of the cap; never less than a
    // zlib buffer's worth.
    let step = (hold.max_disk() / 32).clamp(64 << 10, 16 << 20);
    let held = HeldFile {
        file,
        written: 0,
        held: 0,
        step,
        hold,
        refused: false,
    };
    let mut gz = GzEncoder::new(io::BufWriter::new(held), Compression::new(level.min(9)));
    let mut buf = vec![0u8; 1 << 20];
    let r: io::Result<()> = (|| {
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            out.raw += n as u64;
            gz.write_all(&buf[..n])?;
        }
        Ok(())
    })();
    // Finished and out of the buffer before the file is measured.
    let r = r
        .and_then(|_| gz.try_finish())
        .and_then(|_| gz.get_mut().flush());
    let inner = gz.get_mut().get_mut();
    out.held = inner.held;
    let refused = inner.refused;
    out.refused = refused;
    match r.and_then(|_| inner.file.sync_all()) {
        Ok(()) => out.bytes = inner.written,
        Err(e) => {
            out.error = Some(if refused {
                format!(
                    "not written: larger than the disk cap (max_disk {}) leaves room for beside \
                     the open segment (stopped at {} bytes of gzip)",
                    hold.max_disk(),
                    inner.written
                )
            } else {
                format!("{}: {e}", dst.display())
            });
        }
    }
    drop(gz);
    if out.error.is_some() {
        let _ = std::fs::remove_file(dst);
        out.raw += drain(src);
    }
    out
}

/// Read `src` to its end, keeping nothing; the bytes read.
fn drain(src: &mut dyn Read) -> u64 {
    io::copy(src, &mut io::sink()).unwrap_or(0)
}

struct HeldFile<'a> {
    file: std::fs::File,
    written: u64,
    held: u64,
    step: u64,
    hold: &'a dyn Hold,
    refused: bool,
}

impl Write for HeldFile<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let after = self.written + buf.len() as u64;
        if after > self.held {
            let ask = (after - self.held).max(self.step);
            if self.refused || !self.hold.hold(ask) {
                self.refused = true;
                return Err(io::Error::other("the disk cap refused more room"));
            }
            self.held += ask;
        }
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    struct Budget {
        left: Cell<u64>,
        asked: Cell<u64>,
    }

    impl Hold for Budget {
        fn hold(&self, bytes: u64) -> bool {
            self.asked.set(self.asked.get() + 1);
            if bytes > self.left.get() {
                return false;
            }
            self.left.set(self.left.get() - bytes);
            true
        }
        fn max_disk(&self) -> u64 {
            1 << 20
        }
    }

    /// Bytes that do not compress (xorshift).
    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn a_file_within_its_holds_is_written_whole_and_one_past_them_is_removed() {
        let d = std::env::temp_dir().join(format!("fastprof-held-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let dst = d.join("w.json.gz");
        let data = noise(300 << 10);
        let b = Budget {
            left: Cell::new(1 << 20),
            asked: Cell::new(0),
        };
        let c = gzip_held(&mut &data[..], &dst, 1, &b);
        assert!(c.error.is_none() && !c.refused, "{:?}", c.error);
        assert_eq!(c.raw, data.len() as u64);
        assert_eq!(std::fs::metadata(&dst).unwrap().len(), c.bytes);
        assert!(c.bytes <= c.held && c.held <= 1 << 20);
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(&dst).unwrap())
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, data);
        // Room for less than the gzip: refused, no file, the source read to its end.
        let b = Budget {
            left: Cell::new(128 << 10),
            asked: Cell::new(0),
        };
        let dst2 = d.join("w2.json.gz");
        let c = gzip_held(&mut &data[..], &dst2, 1, &b);
        assert!(c.refused && c.error.unwrap().contains("not written"));
        assert_eq!(c.raw, data.len() as u64);
        assert!(!dst2.exists());
        assert!(c.held <= 128 << 10);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
