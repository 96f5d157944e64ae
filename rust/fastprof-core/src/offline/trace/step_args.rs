//! The args of a trace's fastprof `step` spans that the columns leave out:
//! each step's `epoch` (the Profiler's `begin_epoch`), for the step table of
//! `fastprof export`.
//!
//! [`columns`](super::columns) keeps no span args (its rows would grow by an
//! args column nobody else reads), so the step table reads them here, from
//! the same file, in one more streaming pass of the same scanner. A step
//! span is taken exactly where the columns take it as a row (an `X` event
//! named `step` with a readable `ts` and a `dur` that
//! [`Fields::dur_checked`] accepts), so the two lists are in the same order
//! and of the same length: the caller pairs them by position, and the
//! `number` here (`args.step`, else `args.batch`, else -1) lets it check.

use std::path::Path;

use super::inputs;
use super::scan::{self, Fields, Item};
use crate::contract;
use crate::error::Result;

/// One file's step spans, in file order: a column each.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StepArgs {
    pub pid: Vec<i64>,
    /// `args.step`, else `args.batch`; -1 when neither is an integer.
    pub number: Vec<i64>,
    /// `args.epoch`; -1 when absent or not an integer.
    pub epoch: Vec<i64>,
}

/// The integer value of the first of `keys` present in the `args` object.
pub(crate) fn arg_int(args: Option<&[u8]>, keys: &[&[u8]]) -> Option<i64> {
    let mut found: [Option<i64>; 4] = [None; 4];
    scan::for_each_entry(args?, |k, v| {
        if let Some(i) = keys.iter().position(|key| *key == k) {
            if i < found.len() && found[i].is_none() {
                found[i] = scan::parse_int(v);
            }
        }
    });
    found.into_iter().flatten().next()
}

/// Read the step spans' args of one trace file (a path or a URL, as the
/// columns take it). Errors are the scanner's: a missing file
/// ([`crate::error::CoreError::Io`]), one that is not a trace
/// ([`crate::error::CoreError::Trace`], naming the file and byte offset).
/// A cut file is read up to its last complete event, as the columns read it.
pub fn read_step_args(path: &Path) -> Result<StepArgs> {
    let mut sc = inputs::open_listed(path)?;
    let mut out = StepArgs::default();
    while let Some(item) = sc.next_item()? {
        let Item::Event(raw) = item else { continue };
        let Some(f) = Fields::parse(raw) else {
            continue;
        };
        let get = |r: &Option<std::ops::Range<usize>>| r.clone().map(|r| &raw[r]);
        if get(&f.ph).and_then(scan::str_value) != Some(b"X") {
            continue;
        }
        let name = get(&f.name).and_then(scan::str_value).unwrap_or(b"");
        if name != contract::STEP_SPAN.as_bytes()
            || f.ts_ns(raw).is_none()
            || f.dur_checked(raw).is_none()
        {
            continue;
        }
        let args = get(&f.args);
        out.pid
            .push(get(&f.pid).and_then(scan::parse_int).unwrap_or(-1));
        out.number
            .push(arg_int(args, &[b"step", b"batch"]).unwrap_or(-1));
        out.epoch.push(arg_int(args, &[b"epoch"]).unwrap_or(-1));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("fastprof-step-args-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::File::create(&p)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        p
    }

    #[test]
    fn steps_in_file_order_with_epoch_and_number_and_the_columns_rules() {
        let d = dir("order");
        let p = write(
            &d,
            "t.json",
            r#"{"traceEvents":[
{"ph":"X","name":"step","pid":7,"tid":7,"ts":1.0,"dur":2.0,"args":{"epoch":0,"batch":0,"batch_in_epoch":0}},
{"ph":"X","name":"phase.forward","pid":7,"tid":7,"ts":1.5,"dur":0.5},
{"ph":"X","name":"step","pid":7,"tid":7,"ts":3.0,"dur":-1.0,"args":{"epoch":0,"batch":1}},
{"ph":"C","name":"step","pid":7,"tid":7,"ts":3.5,"args":{"value":1}},
{"ph":"X","name":"step","pid":7,"tid":7,"ts":4.0,"dur":2.0,"args":{"step":9,"batch":2,"epoch":3}},
{"ph":"X","name":"step","pid":8,"tid":8,"ts":4.0,"dur":2.0}
]}"#,
        );
        let got = read_step_args(&p).unwrap();
        // The step with a negative dur is no row, as in the columns.
        assert_eq!(got.pid, vec![7, 7, 8]);
        assert_eq!(got.number, vec![0, 9, -1]);
        assert_eq!(got.epoch, vec![0, 3, -1]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_that_is_not_a_trace_is_an_error_naming_it() {
        let d = dir("bad");
        let p = write(&d, "bad.json", "hello, not a trace");
        let e = read_step_args(&p).unwrap_err().to_string();
        assert!(e.contains("bad.json"), "{e}");
        assert!(read_step_args(&d.join("gone.json")).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
