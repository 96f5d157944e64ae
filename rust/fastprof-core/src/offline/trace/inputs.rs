//! The one input walker: what in the paths a user names (files, directories
//! searched recursively, glob patterns) is a trace. `merge`, `columns` and
//! `analyze` (so the CLI merge, the Profiler's own merge, `read_columns`,
//! `analyze_steps` and every report) all take their files from here, so they
//! all see the same files.
//!
//! Inside a directory a file is an input when its name is a trace's
//! (`*.json`, `*.json.gz`, an open segment `fastprof.*.json.gz.part`), except:
//! * hidden and temporary files (`.name`, `*.tmp-PID*`, `*.tmp`): locks, done
//!   markers and the half-written files of an export in progress or killed;
//! * fastprof's own non-trace JSON (`profiler.json`, `report.json`, torch's
//!   memory timelines `*.memory.*`, the memory profiling's `oom.json`,
//!   `model_summary.json`, `operators.json` and anything in a rank's
//!   `memory/` folder): skipped and listed in [`Inputs::own`].
//!
//! A file named explicitly is always taken (a foreign non-trace file is then
//! an error of the reader that names it). Temporary files left by a process
//! that no longer exists are removed while walking ([`Inputs::removed`]).
//!
//! A URL (`s3://bucket/runs/run1`, see [`crate::offline::trace::remote`]) is listed
//! through the registered storage backend and the objects under it go
//! through the same rules, by their keys relative to the URL, as the files
//! of a directory; one object named by its URL is a file named explicitly.
//! No globs in URLs, and nothing is removed from a store.

use crate::contract;
use crate::error::{CoreError, Result};
use crate::offline::trace::remote;
use crate::offline::trace::scan::Scanner;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Whether a file name looks like a trace we merge.
pub fn is_trace_name(name: &str) -> bool {
    name.ends_with(".json") || name.ends_with(".json.gz") || contract::is_open_segment_name(name)
}

/// Hidden and temporary files are never inputs inside a directory: fastprof
/// (and anything writing atomically) writes `.name.tmp-PID` and renames it.
pub fn is_hidden_or_temp(name: &str) -> bool {
    name.starts_with('.') || name.contains(".tmp-") || name.ends_with(".tmp")
}

/// fastprof's own JSON that is not a trace: the Profiler's summary, a
/// report, torch's memory timeline exported beside a window, what the
/// memory profiling writes (`oom.json`, `model_summary.json`,
/// `operators.json`, the allocator history and snapshots under a rank's
/// `memory/` folder: see [`is_own_path`]) and the triggers' records
/// (`triggers.json`, `live.json`).
pub fn is_own_non_trace(name: &str) -> bool {
    contract::OWN_JSON_FILES.contains(&name) || name.contains(".memory.")
}

/// [`is_own_non_trace`] by name, anything in a `memory/` folder (where
/// fastprof writes a rank's memory profiling, never a trace), and a flight
/// dump (`flight-*.json.gz`, issue #17): a copy of the last seconds the
/// rank's segments also hold, which a merge of the run must not take twice
/// (name the dump itself to read it). A rank's hang evidence
/// (`hang-<n>.json`, issue #37) is not a trace either.
/// The report's folder (`<run>/reports/`: report.json, its CSVs, the
/// operator tables per window `operators.rank{R}.<window>.json`, the model
/// summary) holds no trace either.
pub fn is_own_path(path: &Path, name: &str) -> bool {
    is_own_non_trace(name)
        || name.starts_with("flight-")
        || (name.starts_with(contract::HANG_EVIDENCE_PREFIX) && name.ends_with(".json"))
        || (name.starts_with("operators.") && name.ends_with(".json"))
        || path
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|d| d == "memory" || d == "reports")
}

/// The pid in a temporary file's name `.anything.tmp-PID[.suffix]`.
fn temp_pid(name: &str) -> Option<i32> {
    let rest = &name[name.rfind(".tmp-")? + 5..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|&p| p > 0)
}

/// Whether `pid` is a live process on this host (EPERM: alive, not ours).
fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    exists || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// How old a dead pid's temporary file must be before it is removed. The
/// pid is checked on this host only; on a shared file system a writer on
/// another node has the same file open, and keeps touching it, so a file
/// untouched this long is a leftover whoever wrote it.
pub const STALE_TEMP_SECS: u64 = 120;

/// Whether a file named `name` is a temporary file left by a process that
/// is gone and untouched for [`STALE_TEMP_SECS`].
fn stale_temp(name: &str, m: &std::fs::Metadata) -> bool {
    let Some(pid) = temp_pid(name) else {
        return false;
    };
    let old = m
        .modified()
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age.as_secs() >= STALE_TEMP_SECS);
    m.is_file() && old && !pid_alive(pid)
}

/// What a walk found.
#[derive(Debug, Default)]
pub struct Inputs {
    /// The trace files, in a stable order, without duplicates.
    pub files: Vec<PathBuf>,
    /// What was skipped that looked like a trace (a FIFO, a broken symlink...).
    pub warnings: Vec<String>,
    /// fastprof's own non-trace JSON found inside the directories, skipped.
    pub own: Vec<PathBuf>,
    /// Temporary files of dead processes removed on the way.
    pub removed: Vec<PathBuf>,
    /// Sizes of the objects found under URLs, as listed (a local file's is
    /// asked of the file system: see [`input_len`]).
    pub listed: HashMap<PathBuf, u64>,
}

/// The size of an input as found: a URL's from its listing in `found`, a
/// local file's from the file system; 0 when unknown (progress only).
pub fn input_len(path: &Path, listed: &HashMap<PathBuf, u64>) -> u64 {
    match listed.get(path) {
        Some(&n) => n,
        None if remote::url_of(path).is_some() => 0,
        None => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
    }
}

/// Whether `input` named a folder of inputs rather than one file: a
/// directory, a glob, or a URL that listed anything other than exactly
/// itself. `expanded` is what [`expand_warn`] made of it. The readers skip a
/// non-trace met in a folder with a warning but fail on one named.
pub(crate) fn names_many(input: &Path, expanded: &[PathBuf]) -> bool {
    match remote::url_of(input) {
        Some(_) => expanded != std::slice::from_ref(&input.to_path_buf()),
        None => input.is_dir() || input.to_string_lossy().contains(['*', '?']),
    }
}

/// What a path is, following symlinks, for messages: "a directory", "a
/// FIFO (named pipe)"...; the error when even that cannot be found out
/// (a broken symlink, a symlink loop, a permission problem).
fn file_kind(p: &Path) -> std::io::Result<(std::fs::Metadata, &'static str)> {
    use std::os::unix::fs::FileTypeExt;
    let m = std::fs::metadata(p)?;
    let t = m.file_type();
    let kind = if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    };
    Ok((m, kind))
}

/// Directories already walked, by (device, inode): a symlink back up the
/// tree (or two symlinks to the same directory) is walked once, not 2^depth times.
type Seen = std::collections::HashSet<(u64, u64)>;

fn walk(dir: &Path, found: &mut Inputs, seen: &mut Seen) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).map_err(|e| CoreError::io(dir, e))?;
    if !seen.insert((m.dev(), m.ino())) {
        return Ok(());
    }
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| CoreError::io(dir, e))?
        .filter_map(|e| e.ok())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if is_hidden_or_temp(&name) {
            // Never an input; a dead writer's leftover is removed (a
            // symlink is not followed: lstat, and only a regular file).
            if let Ok(m) = p.symlink_metadata() {
                if stale_temp(&name, &m) && std::fs::remove_file(&p).is_ok() {
                    found.removed.push(p);
                }
            }
            continue;
        }
        let traceish = is_trace_name(&name);
        match file_kind(&p) {
            Ok((m, _)) if m.is_dir() => walk(&p, found, seen)?,
            Ok((m, _)) if m.is_file() && traceish && is_own_path(&p, &name) => found.own.push(p),
            Ok((m, _)) if m.is_file() && traceish => found.files.push(p),
            Ok((m, _)) if m.is_file() => {}
            // Opening a FIFO blocks until a writer comes; a device never ends.
            Ok((_, kind)) if traceish => {
                found.warnings.push(format!(
                    "{}: skipped, {kind} and not a regular file",
                    p.display()
                ));
            }
            Err(err) if traceish => {
                found
                    .warnings
                    .push(format!("{}: skipped, {err}", p.display()));
            }
            _ => {}
        }
    }
    Ok(())
}

/// `*` (any run of bytes) and `?` (one byte) in one path component, in
/// O(len(pat) * len(s)) at worst: on a mismatch only the most recent `*`
/// is retried one byte further (an earlier `*` can never do better), so
/// there is no exponential backtracking whatever the number of stars.
fn wildcard(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    // Position after the last `*` seen, and where in `s` it resumes.
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        match pat.get(p) {
            Some(b'*') => {
                p += 1;
                star = Some((p, i));
            }
            Some(&c) if c == b'?' || c == s[i] => {
                p += 1;
                i += 1;
            }
            _ => match star {
                Some((sp, si)) => {
                    p = sp;
                    i = si + 1;
                    star = Some((sp, si + 1));
                }
                None => return false,
            },
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

fn glob(pattern: &str) -> Result<Vec<PathBuf>> {
    let mut current = vec![if pattern.starts_with('/') {
        PathBuf::from("/")
    } else {
        PathBuf::from(".")
    }];
    for comp in pattern.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        for base in &current {
            if comp.contains(['*', '?']) {
                let Ok(rd) = std::fs::read_dir(base) else {
                    continue;
                };
                let mut names: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
                names.sort();
                for n in names {
                    if wildcard(comp.as_bytes(), n.to_string_lossy().as_bytes()) {
                        next.push(base.join(n));
                    }
                }
            } else {
                let p = base.join(comp);
                if p.symlink_metadata().is_ok() {
                    next.push(p);
                }
            }
        }
        current = next;
    }
    Ok(current
        .into_iter()
        .map(|p| p.strip_prefix("./").map(Path::to_path_buf).unwrap_or(p))
        .collect())
}

/// Open a trace the walker listed, following a rename: a recording closes
/// its open segment `X.part` by renaming it to `X` (same bytes, then more),
/// possibly between the listing and this open, on disk or in a bucket (a
/// run still being written). Every reader opens its inputs through this.
pub fn open_listed(path: &Path) -> Result<Scanner> {
    match Scanner::open(path) {
        Err(CoreError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound
                && path.extension().is_some_and(|e| e == "part") =>
        {
            Scanner::open(&path.with_extension(""))
        }
        other => other,
    }
}

/// Whether `e` says a listed input is no longer there (the recording's disk
/// cap deleted it, or the uploader freed it from a spool, since it was
/// listed): the readers skip it with a warning instead of failing.
pub fn is_gone(e: &CoreError) -> bool {
    matches!(e, CoreError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// The warning for a listed input that [`is_gone`].
pub fn gone_warning(path: &Path) -> String {
    format!(
        "{}: skipped, gone since it was listed (a run still being written)",
        path.display()
    )
}

fn not_found(path: &Path, why: impl Into<String>) -> CoreError {
    CoreError::io(
        path,
        std::io::Error::new(std::io::ErrorKind::NotFound, why.into()),
    )
}

/// One path named by the user (or matched by their glob): a directory is
/// walked, a regular file taken; anything else is an error naming what it is.
fn add(a: &Path, found: &mut Inputs, seen: &mut Seen) -> Result<()> {
    match file_kind(a) {
        Ok((m, _)) if m.is_dir() => walk(a, found, seen),
        Ok((m, _)) if m.is_file() => {
            found.files.push(a.to_path_buf());
            Ok(())
        }
        Ok((_, kind)) => Err(CoreError::io(
            a,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{kind}, not a trace file or a directory"),
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && a.symlink_metadata().is_ok() => {
            Err(not_found(a, "a symlink whose target does not exist"))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(not_found(a, "no such file or directory"))
        }
        Err(e) => Err(CoreError::io(a, e)),
    }
}

/// Expand the command-line inputs into trace files, in a stable order,
/// without duplicates. A missing input is an error naming it.
pub fn expand(args: &[PathBuf]) -> Result<Vec<PathBuf>> {
    expand_warn(args, &mut Vec::new())
}

/// [`expand`], also saying in `warnings` what it skipped inside
/// directories: a FIFO, socket or device with a trace's name (opening it
/// could block forever), a broken symlink, a symlink loop. Every real
/// directory is walked once, however many symlinks lead to it.
pub fn expand_warn(args: &[PathBuf], warnings: &mut Vec<String>) -> Result<Vec<PathBuf>> {
    let found = find(args)?;
    warnings.extend(found.warnings);
    Ok(found.files)
}

/// Each input expanded in turn (as [`expand_warn`]), every file once (where
/// it is first met), with whether its input named a folder of inputs (see
/// `names_many`): what the step analysis and the column read take.
pub fn expand_each(inputs: &[PathBuf], warnings: &mut Vec<String>) -> Result<Vec<(PathBuf, bool)>> {
    let mut files: Vec<(PathBuf, bool)> = Vec::new();
    for input in inputs {
        let expanded = expand_warn(std::slice::from_ref(input), warnings)?;
        let from_dir = names_many(input, &expanded);
        for f in expanded {
            if !files.iter().any(|(p, _)| *p == f) {
                files.push((f, from_dir));
            }
        }
    }
    Ok(files)
}

/// One URL named by the user: the objects at or under it, by the rules of a
/// directory walk applied to their keys relative to it (every component
/// checked for hidden/temporary names, as the walk never enters such a
/// folder), in the order that walk would take them (component by
/// component, sorted). The one object equal to the URL is a file named.
fn add_url(a: &Path, url: &str, found: &mut Inputs) -> Result<()> {
    if url.contains('*') {
        return Err(CoreError::io(
            a,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "glob patterns are not supported in URLs: name the run directory (a prefix) instead",
            ),
        ));
    }
    let objects = remote::list(url).map_err(|e| CoreError::io(a, e))?;
    if objects.is_empty() {
        return Err(not_found(a, "no such object or prefix"));
    }
    let base = url.trim_end_matches('/');
    if let [(only, size)] = objects.as_slice() {
        if only.trim_end_matches('/') == base {
            found.files.push(a.to_path_buf());
            found.listed.insert(a.to_path_buf(), *size);
            return Ok(());
        }
    }
    let mut under: Vec<(Vec<&str>, &str, u64)> = Vec::new();
    for (obj, size) in &objects {
        let Some(rel) = obj.strip_prefix(base).and_then(|r| r.strip_prefix('/')) else {
            // Not under the URL: a backend that returns another form than
            // the one asked. Said, not guessed at.
            found
                .warnings
                .push(format!("{obj}: skipped, listed for {url} but not under it"));
            continue;
        };
        let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
        if comps.is_empty() || comps.iter().any(|c| is_hidden_or_temp(c)) {
            continue;
        }
        under.push((comps, obj, *size));
    }
    under.sort();
    for (comps, obj, size) in under {
        let name = comps.last().expect("checked non-empty");
        if !is_trace_name(name) {
            continue;
        }
        let p = PathBuf::from(obj);
        if is_own_path(&p, name) {
            found.own.push(p);
        } else {
            found.listed.insert(p.clone(), size);
            found.files.push(p);
        }
    }
    Ok(())
}

/// Walk the inputs: trace files, what was skipped and why, fastprof's own
/// non-trace files met inside directories, dead writers' temp files removed.
pub fn find(args: &[PathBuf]) -> Result<Inputs> {
    let mut found = Inputs::default();
    let mut seen = Seen::new();
    for a in args {
        if let Some(url) = remote::url_of(a) {
            add_url(a, url, &mut found)?;
            continue;
        }
        let s = a.to_string_lossy();
        if a.symlink_metadata().is_err() && s.contains(['*', '?']) {
            let matched = glob(&s)?;
            if matched.is_empty() {
                return Err(not_found(a, "no file matches this pattern"));
            }
            for p in matched {
                add(&p, &mut found, &mut seen)?;
            }
        } else {
            add(a, &mut found, &mut seen)?;
        }
    }
    let mut seen = std::collections::HashSet::new();
    found.files.retain(|p| {
        let key = match remote::url_of(p) {
            Some(_) => p.clone(),
            None => p.canonicalize().unwrap_or_else(|_| p.clone()),
        };
        seen.insert(key)
    });
    Ok(found)
}

/// Rank from a path: a `rank{R}` / `rank_{R}` / `rank-{R}` component or file-name part.
pub fn rank_from_path(p: &Path) -> Option<u32> {
    for comp in p.components().rev() {
        let s = comp.as_os_str().to_string_lossy().to_lowercase();
        let mut rest = s.as_str();
        while let Some(i) = rest.find("rank") {
            let tail = rest[i + 4..].trim_start_matches(['_', '-']);
            let digits: String = tail.chars().take_while(|c| c.is_ascii_digit()).collect();
            if !digits.is_empty() {
                return digits.parse().ok();
            }
            rest = &rest[i + 4..];
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_stars_match_in_linear_time() {
        // 13 stars against a 120-byte name that almost matches: exponential
        // backtracking takes longer than the universe has; this is ~1600 steps.
        let name = "a".repeat(120);
        let pat = format!("{}b", "*a".repeat(13));
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            assert!(!wildcard(pat.as_bytes(), name.as_bytes()));
        }
        assert!(wildcard(
            format!("{}a", "*a".repeat(13)).as_bytes(),
            name.as_bytes()
        ));
        // Generous: a thousand linear matches take microseconds each.
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn symlink_loops_are_walked_once_and_fifos_skipped() {
        let dir = std::env::temp_dir().join(format!("fastprof-inputs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/a.json"), "{}").unwrap();
        std::os::unix::fs::symlink(".", dir.join("sub/self1")).unwrap();
        std::os::unix::fs::symlink(".", dir.join("sub/self2")).unwrap();
        std::os::unix::fs::symlink("..", dir.join("sub/up")).unwrap();
        std::os::unix::fs::symlink("loop.json", dir.join("loop.json")).unwrap();
        let fifo =
            std::ffi::CString::new(dir.join("pipe.json").into_os_string().into_encoded_bytes())
                .unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let mut warnings = Vec::new();
        let files = expand_warn(std::slice::from_ref(&dir), &mut warnings).unwrap();
        assert_eq!(files, vec![dir.join("sub/a.json")]);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings
            .iter()
            .any(|w| w.contains("pipe.json") && w.contains("FIFO")));
        assert!(warnings
            .iter()
            .any(|w| w.contains("loop.json") && w.contains("symbolic links")));
        // Named directly, they are errors saying what they are.
        let e = expand(&[dir.join("pipe.json")]).unwrap_err().to_string();
        assert!(e.contains("pipe.json") && e.contains("FIFO"), "{e}");
        let e = expand(&[dir.join("loop.json")]).unwrap_err().to_string();
        assert!(e.contains("symbolic links"), "{e}");
        let e = expand(&[PathBuf::from("/dev/null")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("character device"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hidden_temp_and_own_files_are_never_inputs() {
        for name in [
            ".fastprof.lock",
            ".ep0-ba1.pt.trace.json.tmp-123.json",
            ".report.json.tmp-9",
            "x.json.tmp",
        ] {
            assert!(is_hidden_or_temp(name), "{name}");
        }
        assert!(!is_hidden_or_temp("ep0-ba1.pt.trace.json.gz"));
        assert!(!is_hidden_or_temp("fastprof.0.json.gz.part"));
        for name in [
            "profiler.json",
            "report.json",
            "ep0-ba1.memory.json",
            "oom.json",
            "triggers.json",
            "live.json",
        ] {
            assert!(is_own_non_trace(name), "{name}");
        }
        assert!(!is_own_non_trace("fastprof.0.json.gz"));
        assert!(is_own_path(
            Path::new("run/rank0/memory/window-3.json"),
            "window-3.json"
        ));
        assert!(is_own_path(
            Path::new("run/reports/operators.rank0.ep0-ba1.json"),
            "operators.rank0.ep0-ba1.json"
        ));
        assert!(is_own_path(
            Path::new("run/reports/anything.json"),
            "anything.json"
        ));
        assert!(is_own_path(
            Path::new("run/rank0/flight/flight-001-trigger-ba7.json.gz"),
            "flight-001-trigger-ba7.json.gz"
        ));
        assert!(is_own_path(
            Path::new("run/rank0/hang-12.json"),
            "hang-12.json"
        ));
        assert!(!is_own_path(
            Path::new("run/rank0/torch/w.pt.trace.json"),
            "w.pt.trace.json"
        ));
        assert_eq!(temp_pid(".a.pt.trace.json.tmp-4242.json"), Some(4242));
        assert_eq!(temp_pid(".a.json.gz.tmp-17"), Some(17));
        assert_eq!(temp_pid(".a.tmp-x"), None);
        assert!(pid_alive(std::process::id() as i32));

        let dir = std::env::temp_dir().join(format!("fastprof-walker-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("rank0/torch")).unwrap();
        std::fs::write(dir.join("rank0/fastprof.0.json.gz"), b"").unwrap();
        std::fs::write(dir.join("rank0/profiler.json"), b"{}").unwrap();
        // A pid far above any pid_max is never alive; an hour-old file.
        let stale = dir.join("rank0/torch/.w.pt.trace.json.tmp-2147483000.json");
        std::fs::write(&stale, b"{").unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let fresh = dir.join("rank0/torch/.v.pt.trace.json.tmp-2147483000.json");
        std::fs::write(&fresh, b"{").unwrap();
        let found = find(std::slice::from_ref(&dir)).unwrap();
        assert_eq!(found.files, vec![dir.join("rank0/fastprof.0.json.gz")]);
        assert_eq!(found.own, vec![dir.join("rank0/profiler.json")]);
        assert_eq!(found.removed, vec![stale.clone()]);
        assert!(!stale.exists() && fresh.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wildcards_and_ranks() {
        assert!(wildcard(b"*.json.gz", b"a.pt.trace.json.gz"));
        assert!(wildcard(b"fastprof.?.json.gz", b"fastprof.3.json.gz"));
        assert!(!wildcard(b"*.json", b"a.json.gz"));
        assert!(wildcard(b"*", b""));
        assert!(wildcard(b"a*b*c", b"aXbYbZc"));
        assert!(!wildcard(b"a*b*c", b"aXbYbZ"));
        assert!(wildcard(b"*a?", b"bbab"));
        assert!(!wildcard(b"?", b""));
        assert!(wildcard(b"**x**", b"yyxyy"));
        assert_eq!(
            rank_from_path(Path::new("runs/x/rank3/fastprof.0.json.gz")),
            Some(3)
        );
        assert_eq!(
            rank_from_path(Path::new("runs/trace_rank_12.json")),
            Some(12)
        );
        assert_eq!(
            rank_from_path(Path::new("runs/host_123.pt.trace.json")),
            None
        );
    }
}
