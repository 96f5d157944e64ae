//! Traces on object storage (issue #26): inputs named by URL
//! (`s3://bucket/runs/run1`, `file:///tmp/x`, `memory://...`,
//! `simplecache::s3://...`), listed and streamed through a [`Remote`]
//! registered by the Python package (fsspec underneath), so this crate
//! neither links a storage client nor knows a protocol.
//!
//! A URL travels through the readers as a `PathBuf` holding the URL text
//! unchanged, so messages, `rank_from_path` and the file kinds by name work
//! on it as on a path. Only two places look behind it: the input walker
//! ([`crate::offline::trace::inputs::find`]) lists it, and [`crate::offline::trace::scan::Scanner::open`]
//! opens it. An object is read by ranges as the scanner consumes it (the
//! backend's file object holds its own read-ahead block), never downloaded
//! whole first.

use std::io::Read;
use std::path::Path;
use std::sync::{Arc, RwLock};

/// Whether `s` names a place through a storage backend rather than a local path (the one rule
/// of [`crate::contract::is_url`]).
pub use crate::contract::is_url;

/// The URL a path holds, if it holds one.
pub fn url_of(path: &Path) -> Option<&str> {
    path.to_str().filter(|s| is_url(s))
}

/// A storage backend: lists and opens objects by URL. Methods are called on
/// whatever thread reads (the merge's workers included) and may block on
/// the network.
pub trait Remote: Send + Sync {
    /// Every object at or under `url`, recursively, as (full URL, size in
    /// bytes). When `url` names one object, just it; empty when nothing is
    /// there. The URLs keep `url`'s own form (scheme, chain prefix), so an
    /// object under it is `url` + `/` + its key relative to `url`.
    fn list(&self, url: &str) -> std::io::Result<Vec<(String, u64)>>;

    /// A reader streaming the object `url` from its first byte. Each `read`
    /// may block; memory is the backend's read-ahead, not the object.
    fn open(&self, url: &str) -> std::io::Result<Box<dyn Read + Send>>;
}

/// The process's backend. A lock rather than a once-cell: the Python
/// package registers at import, and tests swap it.
static REMOTE: RwLock<Option<Arc<dyn Remote>>> = RwLock::new(None);

/// Register the backend every URL input goes through (None: none, URLs are
/// then an error).
pub fn set_remote(r: Option<Arc<dyn Remote>>) {
    *REMOTE.write().unwrap_or_else(|e| e.into_inner()) = r;
}

/// The registered backend, if any.
pub fn remote() -> Option<Arc<dyn Remote>> {
    REMOTE.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The backend, or the error saying that none is registered.
fn require() -> std::io::Result<Arc<dyn Remote>> {
    remote().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "reading URLs needs fastprof's Python package (`import fastprof` \
             registers its fsspec storage backend); none is registered in this process",
        )
    })
}

/// [`Remote::list`] through the registered backend.
pub(crate) fn list(url: &str) -> std::io::Result<Vec<(String, u64)>> {
    require()?.list(url)
}

/// [`Remote::open`] through the registered backend.
pub(crate) fn open(url: &str) -> std::io::Result<Box<dyn Read + Send>> {
    require()?.open(url)
}

#[cfg(test)]
pub(crate) mod testing {
    //! One in-memory backend for every test of the crate: the registration
    //! is process-wide and tests run on parallel threads, so each test
    //! keeps to its own URL prefix in the one shared store instead of
    //! registering a backend of its own.

    use super::*;
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};

    /// What the readers of one URL were asked and gave.
    #[derive(Debug, Default, Clone, Copy)]
    pub struct Reads {
        /// The largest single read request.
        pub largest_request: usize,
        /// Bytes handed out.
        pub bytes: usize,
        /// Readers opened.
        pub opened: usize,
    }

    /// Objects by URL; readers hand out at most `chunk` bytes a call.
    pub struct MemRemote {
        pub objects: Mutex<BTreeMap<String, Vec<u8>>>,
        pub chunk: usize,
        /// Per URL, what its readers were asked.
        pub reads: Mutex<BTreeMap<String, Reads>>,
        /// Objects whose reads fail once this many bytes were handed out.
        pub fail_at: Mutex<BTreeMap<String, usize>>,
        /// A listing taken before a rename or a deletion: URLs listed (with
        /// a size) that are not stored, and stored URLs not listed.
        pub stale: Mutex<(BTreeMap<String, u64>, std::collections::BTreeSet<String>)>,
    }

    impl Remote for MemRemote {
        fn list(&self, url: &str) -> std::io::Result<Vec<(String, u64)>> {
            let objects = self.objects.lock().unwrap();
            if let Some(data) = objects.get(url) {
                return Ok(vec![(url.to_string(), data.len() as u64)]);
            }
            let dir = format!("{}/", url.trim_end_matches('/'));
            let stale = self.stale.lock().unwrap();
            let (ghosts, unlisted) = &*stale;
            let mut out: Vec<(String, u64)> = objects
                .iter()
                .filter(|(k, _)| k.starts_with(&dir) && !unlisted.contains(*k))
                .map(|(k, v)| (k.clone(), v.len() as u64))
                .chain(
                    ghosts
                        .iter()
                        .filter(|(k, _)| k.starts_with(&dir))
                        .map(|(k, n)| (k.clone(), *n)),
                )
                .collect();
            out.sort();
            Ok(out)
        }

        fn open(&self, url: &str) -> std::io::Result<Box<dyn Read + Send>> {
            let data = self.objects.lock().unwrap().get(url).cloned();
            let data = data.ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("FileNotFoundError: {url}"),
                )
            })?;
            let fail_at = self.fail_at.lock().unwrap().get(url).copied();
            self.reads
                .lock()
                .unwrap()
                .entry(url.to_string())
                .or_default()
                .opened += 1;
            Ok(Box::new(MemReader {
                url: url.to_string(),
                data,
                at: 0,
                chunk: self.chunk,
                fail_at,
                remote: shared(),
            }))
        }
    }

    struct MemReader {
        url: String,
        data: Vec<u8>,
        at: usize,
        chunk: usize,
        fail_at: Option<usize>,
        remote: &'static MemRemote,
    }

    impl Read for MemReader {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            if self.fail_at.is_some_and(|f| self.at >= f) {
                return Err(std::io::Error::other("ConnectionError: connection reset"));
            }
            let n = out.len().min(self.chunk).min(self.data.len() - self.at);
            out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            let mut reads = self.remote.reads.lock().unwrap();
            let r = reads.entry(self.url.clone()).or_default();
            r.largest_request = r.largest_request.max(out.len());
            r.bytes += n;
            Ok(n)
        }
    }

    /// The shared backend, registered on first use.
    pub fn shared() -> &'static MemRemote {
        static SHARED: OnceLock<&'static MemRemote> = OnceLock::new();
        SHARED.get_or_init(|| {
            let r: &'static MemRemote = Box::leak(Box::new(MemRemote {
                objects: Mutex::new(BTreeMap::new()),
                chunk: 4096,
                reads: Mutex::new(BTreeMap::new()),
                fail_at: Mutex::new(BTreeMap::new()),
                stale: Mutex::new((BTreeMap::new(), Default::default())),
            }));
            set_remote(Some(Arc::new(Shared(r))));
            r
        })
    }

    /// Tests reading URLs hold this (shared) for their whole run; the one
    /// test that unregisters the backend holds it exclusively.
    static IN_USE: RwLock<()> = RwLock::new(());

    /// Hold while reading URLs: the shared backend stays registered.
    pub fn guard() -> std::sync::RwLockReadGuard<'static, ()> {
        let g = IN_USE.read().unwrap_or_else(|e| e.into_inner());
        shared();
        g
    }

    /// Run `f` with no backend registered, then register the shared one again.
    pub fn without_remote<R>(f: impl FnOnce() -> R) -> R {
        let _g = IN_USE.write().unwrap_or_else(|e| e.into_inner());
        let r = shared();
        set_remote(None);
        let out = f();
        set_remote(Some(Arc::new(Shared(r))));
        out
    }

    /// The `Arc` handed to [`set_remote`] around the leaked shared store.
    struct Shared(&'static MemRemote);

    impl Remote for Shared {
        fn list(&self, url: &str) -> std::io::Result<Vec<(String, u64)>> {
            self.0.list(url)
        }
        fn open(&self, url: &str) -> std::io::Result<Box<dyn Read + Send>> {
            self.0.open(url)
        }
    }

    /// What the readers of `url` were asked so far.
    pub fn reads(url: &str) -> Reads {
        shared()
            .reads
            .lock()
            .unwrap()
            .get(url)
            .copied()
            .unwrap_or_default()
    }

    /// Make the listings of `from` say it is there while its object is now
    /// at `to` (None: deleted): a listing taken before a rename or a delete.
    pub fn moved_since_listed(from: &str, to: Option<&str>) {
        let r = shared();
        let mut objects = r.objects.lock().unwrap();
        let data = objects.remove(from).expect("an object to move");
        let mut stale = r.stale.lock().unwrap();
        stale.0.insert(from.to_string(), data.len() as u64);
        if let Some(to) = to {
            stale.1.insert(to.to_string());
            objects.insert(to.to_string(), data);
        }
    }

    /// Put `data` at `url` in the shared store (registering it).
    pub fn put(url: &str, data: impl Into<Vec<u8>>) {
        shared()
            .objects
            .lock()
            .unwrap()
            .insert(url.to_string(), data.into());
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{guard, put, reads, shared, without_remote};
    use super::*;
    use crate::offline::trace::columns::{read_columns, ColumnsOptions};
    use crate::offline::trace::inputs::{find, rank_from_path};
    use crate::test_support::gzip;
    use crate::CoreError;
    use std::path::PathBuf;

    #[test]
    fn urls_and_paths() {
        for u in [
            "s3://bucket/runs/run1",
            "file:///tmp/x",
            "memory://a",
            "simplecache::s3://b/x",
            "gs://b",
            "git+ssh://h/x",
            "s3a://b",
        ] {
            assert!(is_url(u), "{u}");
        }
        for p in [
            "C://x",
            "C:\\runs",
            "runs/s3://x",
            "/tmp/s3://x",
            "s3:/x",
            "1s://x",
            "",
            "s",
            "ab:",
            "rank0/fastprof.0.json.gz",
            "-s3://x",
        ] {
            assert!(!is_url(p), "{p}");
        }
        // A PathBuf keeps the URL's text as it was given.
        let p = PathBuf::from("s3://b/x");
        assert_eq!(p.to_string_lossy(), "s3://b/x");
        assert_eq!(url_of(&p), Some("s3://b/x"));
        assert_eq!(
            PathBuf::from("s3://b/run")
                .join("rank3/fastprof.0.json.gz")
                .to_string_lossy(),
            "s3://b/run/rank3/fastprof.0.json.gz"
        );
        assert_eq!(
            rank_from_path(Path::new("s3://b/run/rank3/fastprof.0.json.gz")),
            Some(3)
        );
    }

    const BASE: i64 = 1_700_000_000_000_000_000;

    /// A closed fastprof segment of `rank`: two steps, spans, an instant
    /// and a counter.
    fn segment(rank: u32) -> Vec<u8> {
        let pid = 40 + rank;
        gzip(
            format!(
                r#"{{"baseTimeNanoseconds":{BASE},"traceEvents":[
{{"ph":"M","name":"fastprof_info","pid":{pid},"tid":0,"args":{{"producer":"fastprof","rank":{rank},"clock":{{"offset_ns":0}}}}}},
{{"ph":"M","name":"process_name","pid":{pid},"tid":0,"args":{{"name":"rank {rank}"}}}},
{{"ph":"X","cat":"user","name":"step","pid":{pid},"tid":1,"ts":10.000,"dur":100.000,"args":{{"step":1}}}},
{{"ph":"X","cat":"user","name":"forward","pid":{pid},"tid":1,"ts":20.500,"dur":30.250}},
{{"ph":"i","cat":"user","name":"ckpt","pid":{pid},"tid":1,"ts":60.001,"s":"t"}},
{{"ph":"C","cat":"user","name":"loss","pid":{pid},"tid":1,"ts":70.000,"args":{{"train":0.5}}}},
{{"ph":"X","cat":"user","name":"step","pid":{pid},"tid":1,"ts":110.000,"dur":50.000,"args":{{"step":2}}}}
],"otherData":{{"producer":"fastprof","rank":{rank},"clock":{{"offset_ns":0}}}}}}"#
            )
            .as_bytes(),
        )
    }

    /// A run directory's files: two ranks' segments, a torch trace, the
    /// Profiler's summary, a hidden file, a half-written temporary, a
    /// report's folder and a file that is no trace by name.
    fn run_files() -> Vec<(&'static str, Vec<u8>)> {
        let torch = format!(
            r#"{{"schemaVersion":1,"traceEvents":[{{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":20.000,"dur":5.000}},{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":9,"tid":9,"ts":19.000,"dur":3.000}}],"baseTimeNanoseconds":{BASE}}}"#
        );
        vec![
            ("rank0/fastprof.0.json.gz", segment(0)),
            ("rank1/fastprof.0.json.gz", segment(1)),
            ("rank0/torch/w.pt.trace.json", torch.into_bytes()),
            ("profiler.json", br#"{"steps": 2}"#.to_vec()),
            (".hidden.json", br#"{"traceEvents":[]}"#.to_vec()),
            (
                "rank1/torch/.w.pt.trace.json.tmp-123.json",
                br#"{"traceEv"#.to_vec(),
            ),
            (".cache/x.json", br#"{"traceEvents":[]}"#.to_vec()),
            ("reports/report.json", br#"{"rows": []}"#.to_vec()),
            (
                "reports/operators.rank0.w.json",
                br#"{"rows": []}"#.to_vec(),
            ),
            ("notes.txt", b"hello".to_vec()),
        ]
    }

    /// The run written to a fresh local directory and to `url` in the
    /// shared in-memory store.
    fn both(name: &str, url: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fastprof-remote-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for (rel, data) in run_files() {
            let p = d.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, &data).unwrap();
            put(&format!("{url}/{rel}"), data);
        }
        d
    }

    /// `paths` as text with the local directory `d` written as `url`.
    fn as_urls(paths: &[PathBuf], d: &Path, url: &str) -> Vec<String> {
        paths
            .iter()
            .map(|p| format!("{url}/{}", p.strip_prefix(d).unwrap().display()))
            .collect()
    }

    fn texts(paths: &[PathBuf]) -> Vec<String> {
        paths.iter().map(|p| p.display().to_string()).collect()
    }

    #[test]
    fn a_url_run_directory_expands_as_the_local_one() {
        let _g = guard();
        let url = "mem://expand/runs/run1";
        let d = both("expand", url);
        let local = find(std::slice::from_ref(&d)).unwrap();
        let remote = find(&[PathBuf::from(url)]).unwrap();
        assert_eq!(
            texts(&remote.files),
            [
                format!("{url}/rank0/fastprof.0.json.gz"),
                format!("{url}/rank0/torch/w.pt.trace.json"),
                format!("{url}/rank1/fastprof.0.json.gz"),
            ]
        );
        assert_eq!(
            texts(&remote.own),
            [
                format!("{url}/profiler.json"),
                format!("{url}/reports/operators.rank0.w.json"),
                format!("{url}/reports/report.json"),
            ]
        );
        assert_eq!(texts(&remote.files), as_urls(&local.files, &d, url));
        assert_eq!(texts(&remote.own), as_urls(&local.own, &d, url));
        assert!(remote.warnings.is_empty() && remote.removed.is_empty());
        // Listed sizes, for the merge's progress.
        assert_eq!(
            crate::offline::trace::inputs::input_len(&remote.files[2], &remote.listed),
            segment(1).len() as u64
        );
        // A trailing slash names the same prefix.
        let slash = find(&[PathBuf::from(format!("{url}/"))]).unwrap();
        assert_eq!(texts(&slash.files).len(), 3);
        // One object named by its URL is taken as it is, even a hidden one.
        let one = PathBuf::from(format!("{url}/.hidden.json"));
        let found = find(std::slice::from_ref(&one)).unwrap();
        assert_eq!(found.files, std::slice::from_ref(&one));
        assert!(!crate::offline::trace::inputs::names_many(
            &one,
            &found.files
        ));
        assert!(crate::offline::trace::inputs::names_many(
            Path::new(url),
            &remote.files
        ));
        // A URL and a local path together, each file once.
        let mixed = find(&[PathBuf::from(url), d.clone(), PathBuf::from(url)]).unwrap();
        assert_eq!(mixed.files.len(), 6);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A merged output's events, sorted: inputs are written by parallel
    /// workers, so the order across inputs is not fixed.
    fn merged_events(path: &Path) -> Vec<String> {
        let text = std::fs::read(path).unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(&text[..]), &mut out)
            .unwrap();
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        let mut events: Vec<String> = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.to_string())
            .collect();
        events.sort();
        events
    }

    #[test]
    fn merge_and_columns_of_a_url_match_the_local_directory() {
        let _g = guard();
        let url = "mem://same/runs/run1";
        let d = both("same", url);

        let opts = ColumnsOptions::default();
        let local = read_columns(std::slice::from_ref(&d), &opts).unwrap();
        let remote = read_columns(&[PathBuf::from(url)], &opts).unwrap();
        assert!(local.spans.len() >= 6, "{:?}", local.spans);
        assert_eq!(remote.spans, local.spans);
        assert_eq!(remote.instants, local.instants);
        assert_eq!(remote.counters, local.counters);
        assert_eq!(remote.names, local.names);
        assert_eq!(remote.categories, local.categories);
        assert_eq!(
            texts(
                &remote
                    .files
                    .iter()
                    .map(|f| f.path.clone())
                    .collect::<Vec<_>>()
            ),
            as_urls(
                &local
                    .files
                    .iter()
                    .map(|f| f.path.clone())
                    .collect::<Vec<_>>(),
                &d,
                url
            )
        );
        let ranks = |c: &crate::offline::trace::columns::Columns| {
            c.files
                .iter()
                .map(|f| (f.kind, f.rank, f.events))
                .collect::<Vec<_>>()
        };
        assert_eq!(ranks(&remote), ranks(&local));
        assert_eq!(remote.warnings, local.warnings);

        let out = d.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let merge = |inputs: Vec<PathBuf>, output: PathBuf| {
            crate::offline::merge::merge(&crate::offline::merge::MergeOptions {
                inputs,
                output,
                threads: 2,
                ..Default::default()
            })
            .unwrap()
        };
        let l = merge(vec![d.clone()], out.join("local.json.gz"));
        let r = merge(vec![PathBuf::from(url)], out.join("remote.json.gz"));
        assert_eq!((r.files, l.files), (3, 3));
        assert_eq!(r.own_files, as_urls(&texts_of(&l.own_files), &d, url));
        assert_eq!((r.events_in, r.events_out), (l.events_in, l.events_out));
        let (le, re) = (
            merged_events(&out.join("local.json.gz")),
            merged_events(&out.join("remote.json.gz")),
        );
        assert!(le.len() > 10);
        assert_eq!(re, le);
        // Every object was streamed in reads no larger than the scanner's
        // buffer, however large the object.
        let seg = reads(&format!("{url}/rank0/fastprof.0.json.gz"));
        assert!(seg.opened >= 3 && seg.bytes > 0, "{seg:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn texts_of(files: &[String]) -> Vec<PathBuf> {
        files.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn a_large_object_is_read_in_bounded_requests() {
        let _g = guard();
        let url = "mem://large/big.json";
        let mut text = format!(r#"{{"baseTimeNanoseconds":{BASE},"traceEvents":["#);
        let mut n = 0;
        while text.len() < 6 << 20 {
            if n > 0 {
                text.push(',');
            }
            text.push_str(&format!(
                r#"{{"ph":"X","cat":"user","name":"op{}","pid":1,"tid":1,"ts":{n}.000,"dur":1.000,"args":{{"pad":"{}"}}}}"#,
                n % 50,
                "x".repeat(200)
            ));
            n += 1;
        }
        text.push_str("]}");
        let size = text.len();
        put(url, text);
        let c = read_columns(&[PathBuf::from(url)], &ColumnsOptions::default()).unwrap();
        assert_eq!(c.spans.len(), n);
        let r = reads(url);
        assert_eq!(r.bytes, size);
        assert!(
            r.largest_request <= 1 << 20 && r.largest_request * 4 < size,
            "{r:?} for {size} bytes"
        );
    }

    #[test]
    fn missing_urls_and_globs_are_errors_naming_them() {
        let _g = guard();
        put(
            "mem://missing/runs/other/a.json",
            br#"{"traceEvents":[]}"#.to_vec(),
        );
        for url in ["mem://missing/runs/run1", "mem://missing/runs/oth"] {
            match find(&[PathBuf::from(url)]) {
                Err(CoreError::Io { path, source }) => {
                    assert_eq!(path, Path::new(url));
                    assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
                }
                other => panic!("{other:?}"),
            }
            let e = read_columns(&[PathBuf::from(url)], &ColumnsOptions::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(url), "{e}");
        }
        let e = find(&[PathBuf::from("mem://missing/runs/*/a.json")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mem://missing/runs/*") && e.contains("glob"),
            "{e}"
        );
        // Opened directly (a listing older than the object's removal).
        let e = crate::offline::trace::scan::Scanner::open(Path::new("mem://missing/gone.json"))
            .err()
            .unwrap();
        assert!(
            matches!(&e, CoreError::Io { path, source }
                if path == Path::new("mem://missing/gone.json")
                    && source.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
    }

    #[test]
    fn a_read_failing_mid_stream_is_an_error_naming_the_url() {
        let _g = guard();
        let url = "mem://failing/run/rank0/fastprof.0.json.gz";
        let mut big = Vec::new();
        for rank in 0..200 {
            big.extend(segment(rank % 2));
        }
        put(url, big);
        shared()
            .fail_at
            .lock()
            .unwrap()
            .insert(url.to_string(), 10_000);
        // Not a salvage of the first 10 kB: the read failed, the object did not end.
        for e in [
            read_columns(&[PathBuf::from(url)], &ColumnsOptions::default()).unwrap_err(),
            read_columns(
                &[PathBuf::from("mem://failing/run")],
                &ColumnsOptions::default(),
            )
            .unwrap_err(),
        ] {
            assert!(
                matches!(&e, CoreError::Io { path, .. } if path == Path::new(url)),
                "{e:?}"
            );
            assert!(e.to_string().contains("connection reset"), "{e}");
        }
    }

    #[test]
    fn reading_a_url_without_a_backend_says_what_is_missing() {
        let e = without_remote(|| find(&[PathBuf::from("s3://bucket/runs/run1")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s3://bucket/runs/run1") && e.contains("fastprof's Python package"),
            "{e}"
        );
        let e = without_remote(|| {
            crate::offline::trace::scan::Scanner::open(Path::new("s3://b/x.json"))
        })
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("s3://b/x.json") && e.contains("Python package"),
            "{e}"
        );
        // A local path is not affected.
        let d = std::env::temp_dir().join(format!("fastprof-remote-none-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("a.json"), "{}").unwrap();
        assert_eq!(
            without_remote(|| find(std::slice::from_ref(&d)))
                .unwrap()
                .files,
            [d.join("a.json")]
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_segment_renamed_or_gone_since_the_listing_is_followed_or_skipped() {
        // A run still being written: the open segment rank0's .part is
        // listed, then closed (renamed) before it is read; rank 1's closed
        // segment is listed, then deleted (a disk cap, a spool freed).
        use super::testing::moved_since_listed;
        let _g = guard();
        let url = "mem://live/run";
        put(&format!("{url}/rank0/fastprof.0.json.gz"), segment(0));
        put(&format!("{url}/rank0/fastprof.1.json.gz.part"), segment(0));
        put(&format!("{url}/rank1/fastprof.0.json.gz"), segment(1));
        moved_since_listed(
            &format!("{url}/rank0/fastprof.1.json.gz.part"),
            Some(&format!("{url}/rank0/fastprof.1.json.gz")),
        );
        moved_since_listed(&format!("{url}/rank1/fastprof.0.json.gz"), None);

        let cols = read_columns(&[PathBuf::from(url)], &ColumnsOptions::default()).unwrap();
        // Both of rank 0's segments read (3 spans each), rank 1's skipped and said.
        assert_eq!(cols.spans.len(), 6, "{:?}", cols.spans);
        let gone = format!("{url}/rank1/fastprof.0.json.gz: skipped, gone since it was listed");
        assert!(
            cols.warnings.iter().any(|w| w.starts_with(&gone)),
            "{:?}",
            cols.warnings
        );

        let out =
            std::env::temp_dir().join(format!("fastprof-live-{}.json.gz", std::process::id()));
        let s = crate::offline::merge::merge(&crate::offline::merge::MergeOptions {
            inputs: vec![PathBuf::from(url)],
            output: out.clone(),
            threads: 2,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.files, 2);
        assert!(
            s.warnings.iter().any(|w| w.starts_with(&gone)),
            "{:?}",
            s.warnings
        );
        let steps = merged_events(&out)
            .iter()
            .filter(|e| e.contains(r#""name":"step""#))
            .count();
        assert_eq!(steps, 4);
        std::fs::remove_file(&out).unwrap();

        let a = crate::offline::analyze::analyze_steps(&[PathBuf::from(url)]).unwrap();
        assert!(
            a.warnings.iter().any(|w| w.starts_with(&gone)),
            "{:?}",
            a.warnings
        );
    }
}
