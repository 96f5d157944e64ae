//! CSV files written a row at a time: a report's per-step tables (a million
//! rows took seconds through Python's `csv`, and as columns held in memory
//! first, most of a report's memory). Integers are written exactly, floats
//! in the shortest text that reads back to the same value (`1.0`, `0.25`,
//! `inf`), a NaN as an empty cell. Text cells are quoted when they hold a comma, a quote or a
//! line break.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{CoreError, Result};

/// A CSV file being written, row by row.
pub struct RowWriter {
    path: PathBuf,
    w: BufWriter<File>,
    line: Vec<u8>,
    ints: itoa::Buffer,
    cells: usize,
}

impl RowWriter {
    /// Create `path` and write the header row.
    pub fn create(path: &Path, headers: &[&str]) -> Result<RowWriter> {
        let file = File::create(path).map_err(|e| CoreError::io(path, e))?;
        let mut w = RowWriter {
            path: path.to_path_buf(),
            w: BufWriter::with_capacity(1 << 20, file),
            line: Vec::with_capacity(512),
            ints: itoa::Buffer::new(),
            cells: 0,
        };
        for h in headers {
            w.text(h);
        }
        w.end()?;
        Ok(w)
    }

    fn sep(&mut self) {
        if self.cells > 0 {
            self.line.push(b',');
        }
        self.cells += 1;
    }

    pub fn int(&mut self, v: i64) {
        self.sep();
        self.line.extend_from_slice(self.ints.format(v).as_bytes());
    }

    /// A float in the shortest text that reads back to it (`1.0`, `0.25`,
    /// `1e300`: Python writes `1e+300`, and either parses the same); NaN is
    /// an empty cell.
    pub fn float(&mut self, x: f64) {
        self.sep();
        if x.is_nan() {
        } else if x.is_infinite() {
            self.line
                .extend_from_slice(if x > 0.0 { b"inf" } else { b"-inf" });
        } else {
            write!(self.line, "{x:?}").expect("write to a Vec");
        }
    }

    pub fn text(&mut self, s: &str) {
        self.sep();
        if s.contains([',', '"', '\n', '\r']) {
            self.line.push(b'"');
            self.line
                .extend_from_slice(s.replace('"', "\"\"").as_bytes());
            self.line.push(b'"');
        } else {
            self.line.extend_from_slice(s.as_bytes());
        }
    }

    pub fn empty(&mut self) {
        self.sep();
    }

    /// End the row (`\r\n`, as Python's `csv` ends rows).
    pub fn end(&mut self) -> Result<()> {
        self.line.extend_from_slice(b"\r\n");
        let r = self.w.write_all(&self.line);
        self.line.clear();
        self.cells = 0;
        r.map_err(|e| CoreError::io(&self.path, e))
    }

    /// Flush everything to the file.
    pub fn finish(mut self) -> Result<()> {
        self.w.flush().map_err(|e| CoreError::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_numbers_text_and_blanks_as_python_csv_does() {
        let dir = std::env::temp_dir().join(format!("fastprof-csv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.csv");
        let mut w = RowWriter::create(&p, &["a", "b", "c"]).unwrap();
        w.int(i64::MIN);
        w.float(3.0);
        w.text("x,\"y\"");
        w.end().unwrap();
        w.float(f64::NAN);
        w.float(0.1);
        w.empty();
        w.end().unwrap();
        w.float(f64::NEG_INFINITY);
        w.float(1e300);
        w.text("step");
        w.end().unwrap();
        w.finish().unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(
            text,
            "a,b,c\r\n-9223372036854775808,3.0,\"x,\"\"y\"\"\"\r\n,0.1,\r\n-inf,1e300,step\r\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
