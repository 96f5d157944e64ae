//! The names a recording writes and its readers read, defined once for both halves of the
//! core: the span and counter names the readers look for, the segment files and the rank's
//! own non-trace files, and the rule that tells a storage URL from a path. The binding exports
//! them from `_core` and the Python package takes them from there
//! (`fastprof.recording.names`), so the recorder, the core's readers and the reports read one
//! definition and cannot drift apart. Names only Python writes and reads live there alone.

/// The Profiler's span around each training step (its args `step`/`batch` number it).
pub const STEP_SPAN: &str = "step";
/// The counter `Session::mark_step` records (`args.value` is the step number).
pub const STEP_COUNTER: &str = "fastprof.step";
/// A DataLoader's spans and counters are `loader.<name>.<what>`.
pub const LOADER_PREFIX: &str = "loader.";
/// The suffix of `loader.<name>.next`, the training thread's wait in the loader's `next()`.
pub const LOADER_NEXT_SUFFIX: &str = ".next";

/// A recording's segment files are `fastprof.{N}.json.gz`, written as `fastprof.{N}.json.gz.part`
/// until closed (see [`segment_name`]).
pub const SEGMENT_PREFIX: &str = "fastprof.";
/// The suffix of a closed segment (and of every gzip trace).
pub const SEGMENT_SUFFIX: &str = ".json.gz";
/// Added to a segment's name while it is open.
pub const OPEN_SUFFIX: &str = ".part";
/// A hidden file in a rank's folder: the first segment index to use (a run resumed on another
/// node continues the numbering of its segments in object storage; written by the Python side).
pub const FIRST_INDEX_FILE: &str = ".fastprof-first-index";
/// The unified trace a merge writes by default (in the run directory).
pub const UNIFIED_TRACE: &str = "trace.json.gz";

/// The Profiler's account of a rank's run.
pub const PROFILER_JSON: &str = "profiler.json";
/// The triggers' record of requests, captures and dumps of a rank.
pub const TRIGGERS_JSON: &str = "triggers.json";
/// A rank's live file while triggers are on: pid and signal to use.
pub const LIVE_JSON: &str = "live.json";
/// The memory profiling's out-of-memory capture.
pub const OOM_JSON: &str = "oom.json";
/// A report's JSON document.
pub const REPORT_JSON: &str = "report.json";
/// The model summary the memory profiling writes.
pub const MODEL_SUMMARY_JSON: &str = "model_summary.json";
/// The operator table the memory profiling writes.
pub const OPERATORS_JSON: &str = "operators.json";
/// A rank's hang evidence, `hang-<n>.json` (issue #37): this prefix, the hang's number, `.json`.
pub const HANG_EVIDENCE_PREFIX: &str = "hang-";
/// The request file `fastprof trigger --stacks` writes in a rank's directory; the hang
/// watchdog thread takes it.
pub const HANG_REQUEST_FILE: &str = "STACKS";
/// fastprof's own JSON files that are not traces (never inputs inside a directory).
pub const OWN_JSON_FILES: [&str; 7] = [
    PROFILER_JSON,
    REPORT_JSON,
    OOM_JSON,
    MODEL_SUMMARY_JSON,
    OPERATORS_JSON,
    TRIGGERS_JSON,
    LIVE_JSON,
];

/// Segment `index`'s file name, open (`.part`) or closed.
pub fn segment_name(index: u64, open: bool) -> String {
    let part = if open { OPEN_SUFFIX } else { "" };
    format!("{SEGMENT_PREFIX}{index}{SEGMENT_SUFFIX}{part}")
}

/// Whether a file name is an open segment's (`fastprof.*.json.gz.part`): the one `.part`
/// file a reader takes (what a killed writer left, salvaged).
pub fn is_open_segment_name(name: &str) -> bool {
    name.starts_with(SEGMENT_PREFIX)
        && name
            .strip_suffix(OPEN_SUFFIX)
            .is_some_and(|n| n.ends_with(SEGMENT_SUFFIX))
}

/// Whether a file name is a fastprof recording's (a segment, open or closed, or any file named
/// `fastprof.*`): read first, so that a rank's clock offset is known before its torch traces.
pub fn is_fastprof_file_name(name: &str) -> bool {
    name.starts_with(SEGMENT_PREFIX)
}

/// Whether `name` is a loader's wait span, `loader.<name>.next`.
pub fn is_loader_next(name: &str) -> bool {
    name.starts_with(LOADER_PREFIX) && name.ends_with(LOADER_NEXT_SUFFIX)
}

/// Whether `s` names a place through a storage backend rather than a local
/// path: `^[A-Za-z][A-Za-z0-9+.-]+(://|::)`. Two letters at least, so a
/// Windows drive `C://x` is a path. The Python package's
/// `fastprof.recording.names.is_url` is this function.
pub fn is_url(s: &str) -> bool {
    let b = s.as_bytes();
    if !b.first().is_some_and(u8::is_ascii_alphabetic) {
        return false;
    }
    let scheme = b[1..]
        .iter()
        .take_while(|&&c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'.' | b'-'))
        .count();
    let rest = &b[1 + scheme..];
    scheme >= 1 && (rest.starts_with(b"://") || rest.starts_with(b"::"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names() {
        assert_eq!(segment_name(3, false), "fastprof.3.json.gz");
        assert_eq!(segment_name(12, true), "fastprof.12.json.gz.part");
        assert!(is_open_segment_name(&segment_name(0, true)));
        assert!(!is_open_segment_name("fastprof.0.json.gz"));
        assert!(!is_open_segment_name("x.0.json.gz.part"));
    }

    #[test]
    fn loader_next_names() {
        assert!(is_loader_next("loader.train.next"));
        assert!(!is_loader_next("loader.train.fetch"));
        assert!(!is_loader_next("train.next"));
    }
}
