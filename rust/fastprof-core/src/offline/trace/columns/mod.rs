//! Spans, instants and counters of traces as columns (numpy-ready vectors),
//! for analysis and reports.
//!
//! Inputs are trace files, run directories (`<out>/<run>/rank*/fastprof.*`
//! segments and `.part` files, torch.profiler `*.pt.trace.json[.gz]`) or a
//! merged trace. Each file is walked once by the streaming
//! [`Scanner`](super::scan::Scanner); [`Fields`] locates the keys a row needs
//! and `args` are looked at only for counters and step markers, so memory is
//! the scanner's buffer plus the rows kept (filters apply while reading; the
//! time window at the end of each file, once its time base is known, since
//! Kineto may write `baseTimeNanoseconds` after its events).
//!
//! Schema (one [`Table`] per kind, row `i` across its vectors):
//! * `name`: index into [`Columns::names`]; `cat`: into [`Columns::categories`]
//!   (the whole `cat` string; `""` when absent).
//! * `ts`, `dur`: integer epoch ns, parsed from decimal text, never a float:
//!   `baseTimeNanoseconds` + relative µs, or absolute epoch µs (torch < 2.4),
//!   plus the rank's clock offset (`otherData.clock.offset_ns`), as `fastprof
//!   merge` places events. `dur` only for spans (X events, and B/E pairs).
//! * `pid`, `tid`: integers as written (-1 where not an integer; a string id,
//!   as Kineto writes for its own tracks, is -1 without a warning).
//! * `rank`: from fastprof metadata, `distributedInfo`, a `rank{R}` path
//!   component, or in a merged trace the `rank R` / `rank R · ...` process names; -1 unknown.
//! * `step`: see [`steps`]; -1 outside every step.
//! * `file`: index into [`Columns::files`].
//! * counters only: `series` (index into `names`: the args key, one row per
//!   key, so `{"a":1,"b":2}` gives two rows) and `value` (f64).

mod steps;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use super::filemeta::FileInfo;
use super::filemeta::{FileMeta, MetaEvent};
use super::scan::{self, str_text as text, Fields, Item};
use crate::contract;
use crate::error::{CoreError, Result};
use crate::offline::trace::inputs;
use crate::offline::trace::step_args;

/// What to read. Name and category filters apply while reading, so rows they
/// leave out never take memory.
#[derive(Debug, Clone)]
pub struct ColumnsOptions {
    /// Keep events with exactly these names (counters: the event name, not the series).
    pub names: Option<Vec<String>>,
    /// Keep events whose name starts with one of these. With `names` too, a
    /// row is kept when either matches.
    pub name_prefixes: Vec<String>,
    /// Keep events with one of these categories (one of the comma-separated
    /// parts of `cat` must match).
    pub categories: Option<Vec<String>>,
    /// Keep rows overlapping `[start_ns, end_ns)` (epoch ns): points inside
    /// it, spans with `ts < end_ns && ts + dur > start_ns`.
    pub start_ns: Option<i64>,
    pub end_ns: Option<i64>,
    pub spans: bool,
    pub instants: bool,
    pub counters: bool,
    /// Spans with one of these categories (a comma-separated part of `cat`
    /// matching) are folded into [`Columns::folded`], one total per (rank,
    /// name, category), instead of a row each: a report reads a torch
    /// window's millions of operators and kernels as totals only. Names
    /// starting with one of [`fold_except`](Self::fold_except) stay rows.
    /// Not with a time window (rows are placed in time only once their file
    /// has been read, so a fold could not leave them out).
    pub fold_categories: Vec<String>,
    pub fold_except: Vec<String>,
    /// Compute the `step` column (the step index of each row).
    pub step_column: bool,
    /// Span names made of one of these prefixes and a number (torch's
    /// `ProfilerStep#N`) are read as the prefix and `*` (`ProfilerStep#*`):
    /// a million-step run would otherwise intern a million names.
    pub collapse_numbered: Vec<String>,
    /// Columns left out of each table (spans, instants, counters): never
    /// pushed, so they take no memory while reading (a report drops
    /// `file`, and the counters' `pid`, `tid`, `cat`). A left-out `pid` is
    /// still read for the rank, into a per-file buffer dropped at the end of
    /// its file; it needs `step_column` off (the step index reads it).
    pub omit: [Omit; 3],
    /// The spans' `epoch` column: a fastprof `step` span's `args.epoch`
    /// (-1 elsewhere), 8 bytes a span: a long run's step pass reads the
    /// epochs with the rows, not in a second pass over the files.
    pub step_epochs: bool,
}

/// Which of a table's optional columns [`ColumnsOptions::omit`] leaves out
/// (`name`, `ts`, `dur`, `rank`, `step`, `series`, `value` are always there).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Omit {
    pub cat: bool,
    pub pid: bool,
    pub tid: bool,
    pub file: bool,
}

impl Omit {
    /// Set one column by name (`cat`, `pid`, `tid`, `file`); false for
    /// another name.
    pub fn set(&mut self, column: &str) -> bool {
        match column {
            "cat" => self.cat = true,
            "pid" => self.pid = true,
            "tid" => self.tid = true,
            "file" => self.file = true,
            _ => return false,
        }
        true
    }
}

impl Default for ColumnsOptions {
    fn default() -> Self {
        ColumnsOptions {
            names: None,
            name_prefixes: Vec::new(),
            categories: None,
            start_ns: None,
            end_ns: None,
            spans: true,
            instants: true,
            counters: true,
            fold_categories: Vec::new(),
            fold_except: Vec::new(),
            step_column: true,
            collapse_numbered: Vec::new(),
            omit: [Omit::default(); 3],
            step_epochs: false,
        }
    }
}

/// The spans of one (rank, name, category) folded by
/// [`ColumnsOptions::fold_categories`]: count, total, longest, and the
/// earliest start and latest end (epoch ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fold {
    pub count: u64,
    pub total_ns: i64,
    pub max_ns: i64,
    pub first_ns: i64,
    pub last_ns: i64,
}

impl Fold {
    fn add(&mut self, ts: i64, dur: i64) {
        self.count += 1;
        self.total_ns = self.total_ns.saturating_add(dur);
        self.max_ns = self.max_ns.max(dur);
        self.first_ns = self.first_ns.min(ts);
        self.last_ns = self.last_ns.max(ts.saturating_add(dur));
    }

    fn new(ts: i64, dur: i64) -> Fold {
        Fold {
            count: 1,
            total_ns: dur,
            max_ns: dur,
            first_ns: ts,
            last_ns: ts.saturating_add(dur),
        }
    }

    fn merge(&mut self, o: &Fold) {
        self.count += o.count;
        self.total_ns = self.total_ns.saturating_add(o.total_ns);
        self.max_ns = self.max_ns.max(o.max_ns);
        self.first_ns = self.first_ns.min(o.first_ns);
        self.last_ns = self.last_ns.max(o.last_ns);
    }
}

/// Folded spans, one row per (rank, name, category), sorted by them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FoldTable {
    pub rank: Vec<i32>,
    pub name: Vec<u32>,
    pub cat: Vec<u32>,
    pub folds: Vec<Fold>,
}

/// Rows of one kind, column by column.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Table {
    pub name: Vec<u32>,
    pub cat: Vec<u32>,
    pub ts: Vec<i64>,
    /// Spans only (empty for the other kinds).
    pub dur: Vec<i64>,
    pub pid: Vec<i64>,
    pub tid: Vec<i64>,
    pub rank: Vec<i32>,
    pub step: Vec<i64>,
    pub file: Vec<u32>,
    /// Counters only.
    pub series: Vec<u32>,
    /// Counters only.
    pub value: Vec<f64>,
    /// Spans with [`ColumnsOptions::step_epochs`]: a fastprof `step` span's
    /// `args.epoch` (-1 on every other row and where it has none).
    pub epoch: Vec<i64>,
}

impl Table {
    pub fn len(&self) -> usize {
        self.ts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ts.is_empty()
    }

    /// Keep rows `from..` for which `keep(self, row)` holds, in order.
    fn retain_from(&mut self, from: usize, keep: impl Fn(&Table, usize) -> bool) {
        let mut w = from;
        for r in from..self.len() {
            if !keep(self, r) {
                continue;
            }
            if w != r {
                self.name[w] = self.name[r];
                self.ts[w] = self.ts[r];
                // Left-out columns (ColumnsOptions::omit) are empty.
                if !self.cat.is_empty() {
                    self.cat[w] = self.cat[r];
                }
                if !self.pid.is_empty() {
                    self.pid[w] = self.pid[r];
                }
                if !self.tid.is_empty() {
                    self.tid[w] = self.tid[r];
                }
                if !self.file.is_empty() {
                    self.file[w] = self.file[r];
                }
                if r < self.rank.len() {
                    self.rank[w] = self.rank[r];
                }
                if !self.dur.is_empty() {
                    self.dur[w] = self.dur[r];
                }
                if !self.series.is_empty() {
                    self.series[w] = self.series[r];
                    self.value[w] = self.value[r];
                }
                if !self.epoch.is_empty() {
                    self.epoch[w] = self.epoch[r];
                }
            }
            w += 1;
        }
        for v in [
            &mut self.name,
            &mut self.cat,
            &mut self.file,
            &mut self.series,
        ] {
            v.truncate(w.min(v.len()));
        }
        for v in [
            &mut self.ts,
            &mut self.pid,
            &mut self.tid,
            &mut self.dur,
            &mut self.epoch,
        ] {
            v.truncate(w.min(v.len()));
        }
        self.value.truncate(w.min(self.value.len()));
        self.rank.truncate(w.min(self.rank.len()));
    }

    /// Every column's capacity down to its length: what `read_columns`
    /// returns holds no spare room (a doubling `Vec` may have reserved up to
    /// twice its rows).
    fn shrink(&mut self) {
        self.name.shrink_to_fit();
        self.cat.shrink_to_fit();
        self.ts.shrink_to_fit();
        self.dur.shrink_to_fit();
        self.pid.shrink_to_fit();
        self.tid.shrink_to_fit();
        self.rank.shrink_to_fit();
        self.step.shrink_to_fit();
        self.file.shrink_to_fit();
        self.series.shrink_to_fit();
        self.value.shrink_to_fit();
        self.epoch.shrink_to_fit();
    }

    /// Whether every column's capacity is its length (see [`Table::shrink`]).
    pub fn is_exact(&self) -> bool {
        self.name.capacity() == self.name.len()
            && self.cat.capacity() == self.cat.len()
            && self.ts.capacity() == self.ts.len()
            && self.dur.capacity() == self.dur.len()
            && self.pid.capacity() == self.pid.len()
            && self.tid.capacity() == self.tid.len()
            && self.rank.capacity() == self.rank.len()
            && self.step.capacity() == self.step.len()
            && self.file.capacity() == self.file.len()
            && self.series.capacity() == self.series.len()
            && self.value.capacity() == self.value.len()
            && self.epoch.capacity() == self.epoch.len()
    }
}

/// Everything read: three tables and the tables their ids index.
#[derive(Debug, Default, Clone)]
pub struct Columns {
    pub spans: Table,
    pub instants: Table,
    pub counters: Table,
    /// Spans folded by [`ColumnsOptions::fold_categories`] (empty without).
    pub folded: FoldTable,
    pub names: Vec<String>,
    pub categories: Vec<String>,
    pub files: Vec<FileInfo>,
    /// One line each, naming the file and, where there is one, the byte offset.
    pub warnings: Vec<String>,
}

/// Read `inputs` (files, directories, globs, as `fastprof merge` takes them).
/// Errors: a missing input is [`CoreError::Io`] (NotFound); a file named
/// directly that is not a trace is [`CoreError::Trace`] (files found in a
/// directory are skipped with a warning instead).
pub fn read_columns(inputs: &[PathBuf], opts: &ColumnsOptions) -> Result<Columns> {
    read_all(inputs, opts, None)
}

/// Rows handed over by [`read_columns_chunked`].
#[derive(Debug)]
pub struct Chunk {
    /// The chunk's rows (spans, instants, counters) and the names and
    /// categories their ids index as they stand so far (an id keeps its
    /// string from one chunk to the next; `folded`, `files` and `warnings`
    /// are empty: they come in the returned [`Columns`]).
    pub columns: Columns,
    /// The index of the chunk's file in the returned [`Columns::files`].
    pub file: u32,
    /// The file's last chunk: its rows are placed with the file's final
    /// clock offset.
    pub last: bool,
    /// In a file's last chunk: by how much the times of its earlier chunks
    /// move (ns), placed with the clock offset known when they were handed
    /// over (a fastprof segment says its offset at its end).
    pub moved_ns: i64,
}

/// What receives each [`Chunk`]; an error stops the read and is returned.
pub type ChunkSink<'a> = &'a mut dyn FnMut(Chunk) -> Result<()>;

/// [`read_columns`], each file's rows handed to `sink` as they are read, a
/// fastprof segment's or a merged trace's every `chunk_rows` rows (other
/// traces, whose time base may come after their events, whole at their
/// end), so that memory holds a
/// chunk, not a file: a long run's report reads its rows in steps. Every row
/// goes to `sink`; the returned [`Columns`] holds no rows, only the folded
/// totals, the files, the warnings and every name and category. Rows are in
/// file order. Not with the step column or a time window. A file that fails
/// after some of its chunks were handed over fails the read (its rows
/// cannot be taken back).
pub fn read_columns_chunked<'a>(
    inputs: &[PathBuf],
    opts: &'a ColumnsOptions,
    chunk_rows: usize,
    sink: ChunkSink<'a>,
) -> Result<Columns> {
    if opts.step_column || opts.start_ns.is_some() || opts.end_ns.is_some() {
        return Err(CoreError::config(
            "chunk_rows",
            "cannot be combined with the step column or a time window (start_ns / end_ns)",
        ));
    }
    read_all(inputs, opts, Some((chunk_rows.max(1), sink)))
}

fn read_all<'a>(
    inputs: &[PathBuf],
    opts: &'a ColumnsOptions,
    chunks: Option<(usize, ChunkSink<'a>)>,
) -> Result<Columns> {
    if !opts.fold_categories.is_empty() && (opts.start_ns.is_some() || opts.end_ns.is_some()) {
        return Err(CoreError::config(
            "fold_categories",
            "cannot be combined with a time window (start_ns / end_ns)",
        ));
    }
    if opts.step_column && opts.omit.iter().any(|o| o.pid) {
        return Err(CoreError::config(
            "omit",
            "a table's pid cannot be left out with the step column (its step is found by pid)",
        ));
    }
    let mut input_warnings = Vec::new();
    let mut files = inputs::expand_each(inputs, &mut input_warnings)?;
    // fastprof segments first, so that a rank's clock offset is known when
    // its torch traces are placed.
    files.sort_by_key(|(p, _)| !is_fastprof_name(p));
    let mut r = Reading::new(opts);
    r.chunks = chunks;
    r.out.warnings.extend(input_warnings);
    let several = files.len() > 1;
    let mut merged_skipped = Vec::new();
    for (path, from_dir) in &files {
        let idx = r.out.files.len();
        match r.read_file(path, idx as u32, several) {
            Ok(info) => {
                if info.skipped.is_some() && info.kind == "merged" {
                    merged_skipped.push(idx);
                }
                r.out.files.push(info);
            }
            Err(e @ CoreError::Trace { .. }) if *from_dir => {
                r.out.warnings.push(format!("skipped, not a trace: {e}"));
                r.out.files.push(FileInfo {
                    skipped: Some("not a trace".into()),
                    ..FileInfo::new(path.clone())
                });
            }
            Err(e) if *from_dir && inputs::is_gone(&e) => {
                r.out.warnings.push(inputs::gone_warning(path));
                r.out.files.push(FileInfo {
                    skipped: Some("gone since listed".into()),
                    ..FileInfo::new(path.clone())
                });
            }
            Err(e) => return Err(e),
        }
    }
    if !merged_skipped.is_empty() && r.out.files.iter().all(|f| f.skipped.is_some()) {
        // Only merged traces (and non-traces) here: read the merged ones.
        for idx in merged_skipped {
            let path = r.out.files[idx].path.clone();
            r.out.files[idx] = r.read_file(&path, idx as u32, false)?;
        }
    } else {
        for idx in merged_skipped {
            let path = r.out.files[idx].path.display().to_string();
            r.out.warnings.push(format!(
                "{path}: skipped, a previous merge output next to its inputs (read it on its own to use it)"
            ));
        }
    }
    Ok(r.finish())
}

fn is_fastprof_name(p: &Path) -> bool {
    p.file_name()
        .is_some_and(|n| contract::is_fastprof_file_name(&n.to_string_lossy()))
}

impl FileInfo {
    pub(crate) fn new(path: PathBuf) -> FileInfo {
        FileInfo {
            path,
            kind: "chrome",
            rank: None,
            base_ns: None,
            offset_ns: 0,
            events: 0,
            salvaged: false,
            cut: None,
            bad_dur: Vec::new(),
            skipped: None,
            rotated: None,
        }
    }
}

/// A string table: ids in order of first use.
#[derive(Default)]
struct Interner {
    ids: HashMap<Box<str>, u32>,
    strings: Vec<String>,
}

impl Interner {
    fn id(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.ids.insert(s.into(), id);
        self.strings.push(s.to_string());
        id
    }
}

/// Which rows the name and category filters keep.
struct Filter {
    names: Option<std::collections::HashSet<String>>,
    prefixes: Vec<String>,
    categories: Option<Vec<String>>,
}

impl Filter {
    fn name(&self, name: &str) -> bool {
        if self.names.is_none() && self.prefixes.is_empty() {
            return true;
        }
        self.names.as_ref().is_some_and(|n| n.contains(name))
            || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }

    fn cat(&self, cat: &str) -> bool {
        match &self.categories {
            None => true,
            Some(set) => cat
                .split(',')
                .any(|c| set.iter().any(|s| s.as_str() == c.trim())),
        }
    }
}

/// A `B` event waiting for its `E`.
struct Open {
    name: u32,
    cat: u32,
    ts: i64,
    keep: bool,
}

struct Reading<'o> {
    opts: &'o ColumnsOptions,
    filter: Filter,
    out: Columns,
    names: Interner,
    cats: Interner,
    markers: Vec<steps::Marker>,
    /// Clock offset per rank, from its fastprof segments.
    rank_offsets: HashMap<u32, i64>,
    /// Per category id: folded or not (None until first seen).
    fold_cat: Vec<Option<bool>>,
    /// Per name id: one of `fold_except`'s prefixes or not.
    fold_except: Vec<Option<bool>>,
    folded: HashMap<(i32, u32, u32), Fold>,
    /// Chunked reading: rows per chunk and where chunks go.
    chunks: Option<(usize, ChunkSink<'o>)>,
}

/// Per-file state while scanning.
struct FileScan {
    meta: FileMeta,
    /// First row of this file in each table, and first marker.
    first: [usize; 3],
    first_marker: usize,
    open: HashMap<(i64, i64), Vec<Open>>,
    step_ordinal: HashMap<i64, i64>,
    /// Name id -> spans left out for a hostile `dur`.
    bad_dur: HashMap<u32, u64>,
    bad_ts: u64,
    bad_ids: u64,
    unpaired: u64,
    /// Folded spans of this file, in its raw time, by (pid, name, cat).
    folded: HashMap<(i64, u32, u32), Fold>,
    /// Per table whose `pid` is left out: the pid of each of this file's
    /// rows (its rank is known only at the end of the file).
    pids: [Vec<i64>; 3],
    /// Chunked reading: the shift the file's chunks so far were placed with.
    emitted: Option<i64>,
}

impl<'o> Reading<'o> {
    fn new(opts: &'o ColumnsOptions) -> Self {
        Reading {
            opts,
            filter: Filter {
                names: opts.names.as_ref().map(|n| n.iter().cloned().collect()),
                prefixes: opts.name_prefixes.clone(),
                categories: opts.categories.clone(),
            },
            out: Columns::default(),
            names: Interner::default(),
            cats: Interner::default(),
            markers: Vec::new(),
            rank_offsets: HashMap::new(),
            fold_cat: Vec::new(),
            fold_except: Vec::new(),
            folded: HashMap::new(),
            chunks: None,
        }
    }

    /// Rows the current file added since its last chunk.
    fn rows_since(&self, fs: &FileScan) -> usize {
        [&self.out.spans, &self.out.instants, &self.out.counters]
            .iter()
            .zip(&fs.first)
            .map(|(t, &from)| t.len() - from)
            .sum()
    }

    /// Place the current file's rows since its last chunk with the clock
    /// offset known so far and hand them over.
    fn emit(&mut self, fs: &mut FileScan, file: u32) -> Result<()> {
        let shift = fs.meta.shift();
        self.place_rows(fs, shift);
        fs.first = [0; 3];
        fs.emitted = Some(shift);
        self.hand_over(file, false, 0)
    }

    /// The rows read since the last chunk, placed, to the sink as a chunk.
    fn hand_over(&mut self, file: u32, last: bool, moved_ns: i64) -> Result<()> {
        let columns = Columns {
            spans: std::mem::take(&mut self.out.spans),
            instants: std::mem::take(&mut self.out.instants),
            counters: std::mem::take(&mut self.out.counters),
            names: self.names.strings.clone(),
            categories: self.cats.strings.clone(),
            ..Columns::default()
        };
        match self.chunks.as_mut() {
            Some((_, sink)) => sink(Chunk {
                columns,
                file,
                last,
                moved_ns,
            }),
            None => Ok(()),
        }
    }

    /// The id of an event's name, as [`ColumnsOptions::collapse_numbered`]
    /// reads it.
    fn name_id(&mut self, kind: u8, name: &str) -> u32 {
        match collapsed(&self.opts.collapse_numbered, kind, name) {
            Some(p) => self.names.id(&format!("{p}*")),
            None => self.names.id(name),
        }
    }

    /// Whether a span of this name and category is folded, not a row.
    fn folds(&mut self, name: u32, cat: u32) -> bool {
        if self.opts.fold_categories.is_empty() {
            return false;
        }
        let (n, c) = (name as usize, cat as usize);
        if self.fold_cat.len() <= c {
            self.fold_cat.resize(c + 1, None);
        }
        let by_cat = *self.fold_cat[c].get_or_insert_with(|| {
            self.cats.strings[c].split(',').any(|part| {
                self.opts
                    .fold_categories
                    .iter()
                    .any(|f| f.as_str() == part.trim())
            })
        });
        if !by_cat {
            return false;
        }
        if self.fold_except.len() <= n {
            self.fold_except.resize(n + 1, None);
        }
        let strings = &self.names.strings;
        let except = *self.fold_except[n].get_or_insert_with(|| {
            self.opts
                .fold_except
                .iter()
                .any(|p| strings[n].starts_with(p.as_str()))
        });
        !except
    }

    /// A complete span: a row, or folded into its (pid, name, cat) total.
    #[allow(clippy::too_many_arguments)]
    fn span(
        &mut self,
        fs: &mut FileScan,
        name: u32,
        cat: u32,
        ts: i64,
        dur: i64,
        pid: i64,
        tid: i64,
        file: u32,
        epoch: i64,
    ) {
        if self.folds(name, cat) {
            fs.folded
                .entry((pid, name, cat))
                .and_modify(|f| f.add(ts, dur))
                .or_insert_with(|| Fold::new(ts, dur));
            return;
        }
        let t = &mut self.out.spans;
        push_row(
            t,
            &self.opts.omit[0],
            &mut fs.pids[0],
            name,
            cat,
            ts,
            pid,
            tid,
            file,
        );
        t.dur.push(dur);
        if self.opts.step_epochs {
            t.epoch.push(epoch);
        }
    }

    /// Scan one file into the tables. With `skip_merged`, a previous merge
    /// output is recognised by its first event and left unread.
    fn read_file(&mut self, path: &Path, file: u32, skip_merged: bool) -> Result<FileInfo> {
        let mut sc = inputs::open_listed(path)?;
        let mut fs = FileScan {
            meta: FileMeta::new(path),
            first: [
                self.out.spans.len(),
                self.out.instants.len(),
                self.out.counters.len(),
            ],
            first_marker: self.markers.len(),
            open: HashMap::new(),
            step_ordinal: HashMap::new(),
            bad_dur: HashMap::new(),
            bad_ts: 0,
            bad_ids: 0,
            unpaired: 0,
            folded: HashMap::new(),
            pids: Default::default(),
            emitted: None,
        };
        let result = (|| -> Result<bool> {
            while let Some(item) = sc.next_item()? {
                match item {
                    Item::Meta { key, raw } => fs.meta.top_level(key, raw),
                    Item::Event(raw) => {
                        let first = skip_merged && fs.meta.info.events == 0;
                        if !self.event(&mut fs, raw, file, first) {
                            return Ok(false);
                        }
                        fs.meta.info.events += 1;
                        let every = self.chunks.as_ref().map_or(usize::MAX, |c| c.0);
                        let placed_early = matches!(fs.meta.info.kind, "fastprof" | "merged");
                        if placed_early && self.rows_since(&fs) >= every {
                            self.emit(&mut fs, file)?;
                        }
                    }
                }
            }
            Ok(true)
        })();
        let complete = match result {
            Ok(c) => c,
            Err(e) => {
                self.rollback(&fs);
                return Err(e);
            }
        };
        if !complete {
            self.rollback(&fs);
            fs.meta.info.kind = "merged";
            fs.meta.info.skipped = Some("a previous merge output".into());
            return Ok(fs.meta.info);
        }
        let name = path.display();
        self.out.warnings.extend(sc.warnings().iter().cloned());
        if let Some(s) = sc.salvage() {
            fs.meta.info.salvaged = true;
            fs.meta.info.cut = Some((s.offset, s.reason.clone()));
            self.out.warnings.push(format!(
                "{name}: salvaged a cut file: kept the {} events before byte {} of its text, {} bytes after it unused ({})",
                fs.meta.info.events, s.offset, s.unused_bytes, s.reason
            ));
        }
        if !fs.bad_dur.is_empty() {
            let mut bad: Vec<(String, u64)> = fs
                .bad_dur
                .iter()
                .map(|(&id, &n)| (self.names.strings[id as usize].clone(), n))
                .collect();
            bad.sort();
            let total: u64 = bad.iter().map(|(_, n)| n).sum();
            let listed: Vec<String> = bad.iter().map(|(n, c)| format!("{n:?} x{c}")).collect();
            self.out.warnings.push(format!(
                "{name}: {total} spans with a negative, out-of-range or unreadable dur were left out ({})",
                listed.join(", ")
            ));
            fs.meta.info.bad_dur = bad;
        }
        for (n, what) in [
            (fs.bad_ts, "events without a readable ts were left out"),
            (
                fs.bad_ids,
                "events have a pid or tid that is not an integer (read as -1)",
            ),
            (fs.unpaired, "B/E events did not pair up and were left out"),
        ] {
            if n > 0 {
                self.out.warnings.push(format!("{name}: {n} {what}"));
            }
        }
        let unclosed: usize = fs.open.values().map(Vec::len).sum();
        if unclosed > 0 {
            self.out.warnings.push(format!(
                "{name}: {unclosed} B events had no E by the end and were left out"
            ));
        }
        self.place(&mut fs);
        if self.chunks.is_some() {
            // place() has placed the rows with the file's own offset: handed over as they are.
            let moved = fs.emitted.map_or(0, |s| fs.meta.shift().saturating_sub(s));
            fs.first = [0; 3];
            self.hand_over(file, true, moved)?;
        }
        Ok(fs.meta.info)
    }

    /// Forget the rows and markers a file added.
    fn rollback(&mut self, fs: &FileScan) {
        let keep_none = |_: &Table, _: usize| false;
        self.out.spans.retain_from(fs.first[0], keep_none);
        self.out.instants.retain_from(fs.first[1], keep_none);
        self.out.counters.retain_from(fs.first[2], keep_none);
        self.markers.truncate(fs.first_marker);
    }

    /// One event. False to stop reading the file (a merged trace to skip).
    fn event(&mut self, fs: &mut FileScan, raw: &[u8], file: u32, first: bool) -> bool {
        let Some(f) = Fields::parse(raw) else {
            return true;
        };
        let get = |r: &Option<std::ops::Range<usize>>| r.clone().map(|r| &raw[r]);
        let ph = get(&f.ph).and_then(scan::str_value).unwrap_or(b"");
        let name_raw = get(&f.name).unwrap_or(b"\"\"");
        if ph == b"M" {
            return !(fs.meta.metadata_event(&f, raw) == MetaEvent::MergeMarker && first);
        }
        let kind = match ph {
            b"X" | b"B" | b"E" => 0,
            b"i" | b"I" => 1,
            b"C" => 2,
            _ => return true,
        };
        let Some(ts) = f.ts_ns(raw) else {
            fs.bad_ts += 1;
            return true;
        };
        fs.meta.note_ts(ts);
        let mut id = |r: &Option<std::ops::Range<usize>>| match get(r) {
            None => 0,
            // A string id is valid Chrome-trace JSON (Kineto names its
            // "PyTorch Profiler" tracks so): -1, not counted as bad.
            Some(v) if v.first() == Some(&b'"') => -1,
            Some(v) => scan::parse_int(v).unwrap_or_else(|| {
                fs.bad_ids += 1;
                -1
            }),
        };
        let (pid, tid) = (id(&f.pid), id(&f.tid));
        let name = text(name_raw);
        let dur = f.dur_ns(raw);
        if self.opts.step_column {
            // The markers serve only the step column: without it a long
            // run's ~48 bytes a step are never held (#38).
            self.step_marker(fs, ph, &name, &f, raw, pid, ts, dur);
        }

        let wanted = match kind {
            0 => self.opts.spans,
            1 => self.opts.instants,
            _ => self.opts.counters,
        };
        if ph == b"E" {
            // Closes the innermost B of its thread, whatever its own name says.
            match fs.open.get_mut(&(pid, tid)).and_then(Vec::pop) {
                Some(o) if o.keep && ts < o.ts => *fs.bad_dur.entry(o.name).or_default() += 1,
                Some(o) if o.keep => {
                    self.span(fs, o.name, o.cat, o.ts, ts - o.ts, pid, tid, file, -1)
                }
                Some(_) => {}
                None => fs.unpaired += 1,
            }
            return true;
        }
        let cat_raw = get(&f.cat);
        let cat = cat_raw.map(text).unwrap_or(Cow::Borrowed(""));
        let keep = wanted && self.filter.name(&name) && self.filter.cat(&cat);
        if ph == b"B" {
            let (name, cat) = if keep {
                (self.name_id(kind, &name), self.cats.id(&cat))
            } else {
                (0, 0)
            };
            fs.open.entry((pid, tid)).or_default().push(Open {
                name,
                cat,
                ts,
                keep,
            });
            return true;
        }
        if !keep {
            return true;
        }
        let name_id = self.name_id(kind, &name);
        let cat_id = self.cats.id(&cat);
        match kind {
            0 if f.dur_checked(raw).is_none() => *fs.bad_dur.entry(name_id).or_default() += 1,
            0 => {
                let epoch = if self.opts.step_epochs
                    && name == contract::STEP_SPAN
                    && matches!(fs.meta.info.kind, "fastprof" | "merged")
                {
                    step_args::arg_int(get(&f.args), &[b"epoch"]).unwrap_or(-1)
                } else {
                    -1
                };
                self.span(fs, name_id, cat_id, ts, dur, pid, tid, file, epoch)
            }
            1 => push_row(
                &mut self.out.instants,
                &self.opts.omit[1],
                &mut fs.pids[1],
                name_id,
                cat_id,
                ts,
                pid,
                tid,
                file,
            ),
            _ => {
                let Some(args) = get(&f.args) else {
                    return true;
                };
                let (t, names) = (&mut self.out.counters, &mut self.names);
                let (omit, pids) = (&self.opts.omit[2], &mut fs.pids[2]);
                scan::for_each_entry(args, |key, v| {
                    if let Some(value) = number(v) {
                        push_row(t, omit, pids, name_id, cat_id, ts, pid, tid, file);
                        t.series.push(names.id(&text(key)));
                        t.value.push(value);
                    }
                });
            }
        }
        true
    }

    /// Note a step marker: fastprof `step` spans, torch `ProfilerStep#N`,
    /// `fastprof.step` counters.
    #[allow(clippy::too_many_arguments)]
    fn step_marker(
        &mut self,
        fs: &mut FileScan,
        ph: &[u8],
        name: &str,
        f: &Fields,
        raw: &[u8],
        pid: i64,
        ts: i64,
        dur: i64,
    ) {
        let args = || f.args.clone().map(|r| &raw[r]);
        let arg_int = |keys: &[&[u8]]| {
            let mut found = None;
            if let Some(a) = args() {
                scan::for_each_entry(a, |k, v| {
                    if found.is_none() && keys.contains(&k) {
                        found = number(v).filter(|x| x.fract() == 0.0).map(|x| x as i64);
                    }
                });
            }
            found
        };
        let (number, end) = match ph {
            b"X" if name == contract::STEP_SPAN
                && matches!(fs.meta.info.kind, "fastprof" | "merged") =>
            {
                let ordinal = fs.step_ordinal.entry(pid).or_insert(0);
                let n = arg_int(&[b"step", b"batch"]).unwrap_or(*ordinal);
                *ordinal += 1;
                (n, Some(ts + dur))
            }
            b"X" => match name.strip_prefix("ProfilerStep#").map(str::parse::<i64>) {
                Some(Ok(n)) => (n, Some(ts + dur)),
                _ => return,
            },
            b"C" if name == contract::STEP_COUNTER => match arg_int(&[b"value"]) {
                Some(n) => (n, None),
                None => return,
            },
            _ => return,
        };
        self.markers.push(steps::Marker {
            rank: -1,
            pid,
            start: ts,
            end,
            number,
        });
    }

    /// At the end of a file: epoch ns, rank, clock offset, the time window.
    fn place(&mut self, fs: &mut FileScan) {
        fs.meta.settle_offset(&mut self.rank_offsets);
        if let Some(w) = fs.meta.time_base_warning() {
            self.out.warnings.push(w);
        }
        let shift = fs.meta.shift();
        self.place_rows(fs, shift);
        let meta = &fs.meta;
        let rank_of = |pid: i64| meta.rank_of(pid);
        for ((pid, name, cat), mut f) in fs.folded.drain() {
            f.first_ns = f.first_ns.saturating_add(shift);
            f.last_ns = f.last_ns.saturating_add(shift);
            self.folded
                .entry((rank_of(pid), name, cat))
                .and_modify(|g| g.merge(&f))
                .or_insert(f);
        }
        for m in &mut self.markers[fs.first_marker..] {
            m.start = m.start.saturating_add(shift);
            m.end = m.end.map(|e| e.saturating_add(shift));
            m.rank = rank_of(m.pid);
        }
    }

    /// The current file's rows since `fs.first` onto the epoch-ns timeline
    /// (`shift`), with their ranks, and the time window applied.
    fn place_rows(&mut self, fs: &mut FileScan, shift: i64) {
        let meta = &fs.meta;
        let rank_of = |pid: i64| meta.rank_of(pid);
        let (start, end) = (
            self.opts.start_ns.unwrap_or(i64::MIN),
            self.opts.end_ns.unwrap_or(i64::MAX),
        );
        let tables = [
            &mut self.out.spans,
            &mut self.out.instants,
            &mut self.out.counters,
        ];
        for ((t, &from), pids) in tables.into_iter().zip(&fs.first).zip(&mut fs.pids) {
            for r in from..t.len() {
                t.ts[r] = t.ts[r].saturating_add(shift);
                let pid = if t.pid.is_empty() {
                    pids[r - from]
                } else {
                    t.pid[r]
                };
                t.rank.push(rank_of(pid));
            }
            // This file's buffer of left-out pids is done with.
            *pids = Vec::new();
            if self.opts.start_ns.is_some() || self.opts.end_ns.is_some() {
                t.retain_from(from, |t, r| {
                    let (ts, dur) = (t.ts[r], t.dur.get(r).copied().unwrap_or(0));
                    if dur > 0 {
                        ts < end && ts.saturating_add(dur) > start
                    } else {
                        ts >= start && ts < end
                    }
                });
            }
        }
    }

    fn finish(mut self) -> Columns {
        let mut out = self.out;
        for t in [&mut out.spans, &mut out.instants, &mut out.counters] {
            t.shrink();
        }
        if self.opts.step_column {
            let index = steps::Index::new(std::mem::take(&mut self.markers));
            for t in [&mut out.spans, &mut out.instants, &mut out.counters] {
                t.step = (0..t.len())
                    .map(|r| index.step(t.rank[r], t.pid[r], t.ts[r]))
                    .collect();
            }
        }
        let mut folded: Vec<((i32, u32, u32), Fold)> = self.folded.into_iter().collect();
        folded.sort_unstable_by_key(|(k, _)| *k);
        for ((rank, name, cat), f) in folded {
            out.folded.rank.push(rank);
            out.folded.name.push(name);
            out.folded.cat.push(cat);
            out.folded.folds.push(f);
        }
        if self.chunks.is_some() {
            // The chunks' ids index the names as interned: keep them all.
            out.names = std::mem::take(&mut self.names.strings);
            out.categories = std::mem::take(&mut self.cats.strings);
            return out;
        }
        // Tables hold only what kept rows use (the time window may have
        // dropped rows after their names were interned).
        let mut used = vec![u32::MAX; self.names.strings.len()];
        let mut names = Vec::new();
        let mut remap = |id: &mut u32| {
            let slot = &mut used[*id as usize];
            if *slot == u32::MAX {
                *slot = names.len() as u32;
                names.push(std::mem::take(&mut self.names.strings[*id as usize]));
            }
            *id = *slot;
        };
        for t in [&mut out.spans, &mut out.instants, &mut out.counters] {
            t.name.iter_mut().for_each(&mut remap);
            t.series.iter_mut().for_each(&mut remap);
        }
        out.folded.name.iter_mut().for_each(&mut remap);
        for t in [&mut out.spans, &mut out.instants, &mut out.counters] {
            t.step.shrink_to_fit();
        }
        out.names = names;
        let mut used = vec![u32::MAX; self.cats.strings.len()];
        let mut cats = Vec::new();
        let folded_cats = &mut out.folded.cat;
        for ids in [
            &mut out.spans.cat,
            &mut out.instants.cat,
            &mut out.counters.cat,
            folded_cats,
        ] {
            for id in ids.iter_mut() {
                let slot = &mut used[*id as usize];
                if *slot == u32::MAX {
                    *slot = cats.len() as u32;
                    cats.push(std::mem::take(&mut self.cats.strings[*id as usize]));
                }
                *id = *slot;
            }
        }
        out.categories = cats;
        out
    }
}

/// The prefix of `collapse` that a span's `name` is followed by digits only.
fn collapsed<'p>(collapse: &'p [String], kind: u8, name: &str) -> Option<&'p str> {
    if kind != 0 {
        return None;
    }
    collapse.iter().map(String::as_str).find(|p| {
        name.strip_prefix(p)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// One row's common columns, those of `omit` left out (a left-out pid goes
/// to the file's buffer `pids`, for its rank).
#[allow(clippy::too_many_arguments)]
fn push_row(
    t: &mut Table,
    omit: &Omit,
    pids: &mut Vec<i64>,
    name: u32,
    cat: u32,
    ts: i64,
    pid: i64,
    tid: i64,
    file: u32,
) {
    t.name.push(name);
    t.ts.push(ts);
    if !omit.cat {
        t.cat.push(cat);
    }
    if omit.pid {
        pids.push(pid);
    } else {
        t.pid.push(pid);
    }
    if !omit.tid {
        t.tid.push(tid);
    }
    if !omit.file {
        t.file.push(file);
    }
}

/// A counter value: a JSON number, or a string holding one (fastprof
/// writes NaN and infinities as `"NaN"`, `"Infinity"`, `"-Infinity"`).
fn number(raw: &[u8]) -> Option<f64> {
    let t = scan::str_value(raw).unwrap_or(raw);
    std::str::from_utf8(t).ok()?.parse().ok()
}
