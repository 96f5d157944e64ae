//! Records to events: the writer's per-thread drain state (open spans, step context), the
//! pairing of Begin/End into complete events, and each event's Chrome-trace JSON, formatted once.

use super::SessionShared;
use crate::json;
use crate::runtime::clock::{Anchor, Calibration};
use crate::runtime::names;
use crate::runtime::record::{Kind, Record, FLAG_EXCEPTION, FLAG_STEP};
use crate::runtime::registry::{NewThread, ThreadMeta};
use crate::runtime::ring::Consumer;
use crate::runtime::sink::{Batch, Header};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Clone)]
pub(super) enum SpanName {
    Id(u32),
    Owned(Box<str>),
}

/// An async span whose end has not been drained yet.
pub(super) struct OpenAsync {
    pub(super) id: u64,
    pub(super) name: SpanName,
    pub(super) ti: usize,
}

pub(super) struct Open {
    pub(super) name: SpanName,
    /// CLOCK_MONOTONIC ns, converted when the Begin was drained (while the
    /// calibration around it was current).
    pub(super) ns: u64,
    pub(super) args: OpenArgs,
}

/// A span's args, as its Begin carried them.
pub(super) enum OpenArgs {
    None,
    /// A ready JSON object (the slow path's extra).
    Json(Box<str>),
    /// A training step's numbers, resolved against the thread's step
    /// context when the Begin was drained, formatted here.
    Step {
        epoch: u64,
        batch: u64,
        batch_in_epoch: u64,
        action: u32,
    },
}

pub(super) struct ThreadState {
    pub(super) consumer: Consumer,
    pub(super) meta: Arc<ThreadMeta>,
    pub(super) stack: Vec<Open>,
    /// The last `StepContext` this thread's ring carried: (epoch, its first
    /// global step, action name id).
    pub(super) step_context: (u64, u64, u32),
}

/// Everything but the sinks, so that sinks can read the metadata (through
/// [`MetaSource`](crate::runtime::sink::MetaSource)) while the collector hands them batches.
pub(crate) struct State {
    pub(super) shared: Arc<SessionShared>,
    pub(super) header: Arc<Header>,
    pub(super) threads: Vec<ThreadState>,
    pub(super) adopted: Vec<NewThread>,
    pub(super) thread_names: BTreeMap<u64, String>,
    /// Drop counts of threads that exited and were forgotten.
    pub(super) retired_drops: BTreeMap<u64, u64>,
    pub(super) anchors: Vec<(Anchor, &'static str)>,
    /// Periodic anchors dropped to keep [`MAX_ANCHORS`](super::meta::MAX_ANCHORS).
    pub(super) anchors_dropped: u64,
    /// Escaped JSON of every interned name, by id.
    pub(super) names: Vec<Vec<u8>>,
    /// Async spans begun and not yet ended, oldest first.
    pub(super) open_async: Vec<OpenAsync>,
    pub(super) events_written: u64,
    pub(super) unclosed_spans: u64,
    pub(super) sink_errors: Vec<String>,
    pub(super) cal: Calibration,
}

impl State {
    pub(super) fn adopt_new_threads(&mut self) {
        self.shared.take_new_threads(&mut self.adopted);
        for t in self.adopted.drain(..) {
            self.thread_names
                .insert(t.meta.tid, t.meta.name.to_string());
            self.threads.push(ThreadState {
                consumer: t.consumer,
                meta: t.meta,
                stack: Vec::new(),
                step_context: (0, 0, u32::MAX),
            });
        }
    }

    /// Free the rings of threads that exited and whose every event has been
    /// written; their drop counts move to `retired_drops`.
    pub(super) fn forget_exited_threads(&mut self) {
        let retired = &mut self.retired_drops;
        self.threads.retain(|t| {
            let gone = t.consumer.producer_gone() && t.consumer.is_empty() && t.stack.is_empty();
            if gone {
                let d = t.meta.drops.load(Ordering::Relaxed);
                if d > 0 {
                    *retired.entry(t.meta.tid).or_insert(0) += d;
                }
            }
            !gone
        });
    }

    /// Drops per thread id, live and retired threads together.
    pub(super) fn drops(&self) -> BTreeMap<u64, u64> {
        let mut m = self.retired_drops.clone();
        for t in &self.threads {
            let n = t.meta.drops.load(Ordering::Relaxed);
            if n > 0 {
                *m.entry(t.meta.tid).or_insert(0) += n;
            }
        }
        m
    }

    pub(super) fn format_record(&mut self, batch: &mut Batch, ti: usize, mut rec: Record) {
        let (owned_name, args, async_id) = match rec.take_extra() {
            Some(x) => {
                self.shared
                    .payload_in_flight
                    .fetch_sub(x.bytes(), Ordering::Relaxed);
                (x.name, x.args_json, x.async_id)
            }
            None => (None, None, 0),
        };
        let name = match owned_name {
            Some(n) => SpanName::Owned(n),
            None => SpanName::Id(rec.name),
        };
        let ns = self.cal.to_ns(rec.ts);
        match rec.kind() {
            Kind::Begin => {
                let t = &mut self.threads[ti];
                let args = match args {
                    Some(a) => OpenArgs::Json(a),
                    None if rec.flags() & FLAG_STEP != 0 => {
                        let (epoch, first, action) = t.step_context;
                        let batch = rec.plain_payload();
                        OpenArgs::Step {
                            epoch,
                            batch,
                            batch_in_epoch: batch.saturating_sub(first),
                            action,
                        }
                    }
                    None => OpenArgs::None,
                };
                t.stack.push(Open { name, ns, args })
            }
            Kind::StepContext => {
                self.threads[ti].step_context = (rec.ts, rec.plain_payload(), rec.name);
            }
            Kind::End => {
                if let Some(open) = self.threads[ti].stack.pop() {
                    let flags: &[(&str, &str)] = if rec.flags() & FLAG_EXCEPTION != 0 {
                        &[("exception", "true")]
                    } else {
                        &[]
                    };
                    self.format_span(batch, ti, &open, ns, flags);
                } // else: unreachable by the producer's protocol
            }
            Kind::Instant => {
                self.event_head(batch, ti, b"i", &name, ns);
                batch.bytes.extend_from_slice(b",\"s\":\"t\"");
                write_args(&mut batch.bytes, args.as_deref(), &[]);
                batch.event_done(ns, ns);
            }
            Kind::AsyncBegin => {
                self.async_head(batch, ti, b"b", &name, async_id, ns);
                write_args(&mut batch.bytes, args.as_deref(), &[]);
                batch.event_done(ns, ns);
                self.open_async.push(OpenAsync {
                    id: async_id,
                    name,
                    ti,
                });
            }
            Kind::AsyncEnd => {
                // The innermost open span of this key; none means its begin
                // was gated by a pause or dropped: then the end goes too.
                if let Some(i) = self.open_async.iter().rposition(|o| o.id == async_id) {
                    let open = self.open_async.remove(i);
                    self.async_head(batch, ti, b"e", &open.name, async_id, ns);
                    // The end's own args: `exception` when the body raised.
                    write_args(&mut batch.bytes, args.as_deref(), &[]);
                    batch.event_done(ns, ns);
                }
            }
            Kind::Counter => {
                self.event_head(batch, ti, b"C", &name, ns);
                match args {
                    Some(a) => write_args(&mut batch.bytes, Some(&a), &[]),
                    None => {
                        batch.bytes.extend_from_slice(b",\"args\":{\"value\":");
                        json::write_f64(&mut batch.bytes, rec.value());
                        batch.bytes.push(b'}');
                    }
                }
                batch.event_done(ns, ns);
            }
        }
    }

    /// An X event; `end_ns` in CLOCK_MONOTONIC ns.
    pub(super) fn format_span(
        &mut self,
        batch: &mut Batch,
        ti: usize,
        open: &Open,
        end_ns: u64,
        flags: &[(&str, &str)],
    ) {
        self.event_head(batch, ti, b"X", &open.name, open.ns);
        batch.bytes.extend_from_slice(b",\"dur\":");
        json::write_us(&mut batch.bytes, end_ns.saturating_sub(open.ns) as i64);
        match &open.args {
            OpenArgs::None => write_args(&mut batch.bytes, None, flags),
            OpenArgs::Json(a) => write_args(&mut batch.bytes, Some(a), flags),
            &OpenArgs::Step {
                epoch,
                batch: step,
                batch_in_epoch,
                action,
            } => {
                let members = |b: &mut Vec<u8>| {
                    b.extend_from_slice(b"\"epoch\":");
                    json::write_int(b, epoch);
                    b.extend_from_slice(b",\"batch\":");
                    json::write_int(b, step);
                    b.extend_from_slice(b",\"batch_in_epoch\":");
                    json::write_int(b, batch_in_epoch);
                    b.extend_from_slice(b",\"action\":");
                    self.write_name(b, action);
                };
                write_args_with(&mut batch.bytes, flags, Some(members));
            }
        }
        batch.event_done(open.ns, end_ns);
    }

    /// An async event's head: `cat` "async" and the key as a hex `id`.
    pub(super) fn async_head(
        &mut self,
        batch: &mut Batch,
        ti: usize,
        ph: &[u8],
        name: &SpanName,
        id: u64,
        ns: u64,
    ) {
        self.head_with_cat(batch, ti, ph, b"async", name, ns);
        batch.bytes.extend_from_slice(b",\"id\":\"0x");
        let _ = std::io::Write::write_fmt(&mut batch.bytes, format_args!("{id:x}"));
        batch.bytes.push(b'"');
    }

    /// `,\n{"ph":..,"cat":"user","name":..,"pid":..,"tid":..,"ts":..` (no
    /// closing brace); `ns` in CLOCK_MONOTONIC ns.
    pub(super) fn event_head(
        &mut self,
        batch: &mut Batch,
        ti: usize,
        ph: &[u8],
        name: &SpanName,
        ns: u64,
    ) {
        self.head_with_cat(batch, ti, ph, b"user", name, ns);
    }

    pub(super) fn head_with_cat(
        &mut self,
        batch: &mut Batch,
        ti: usize,
        ph: &[u8],
        cat: &[u8],
        name: &SpanName,
        ns: u64,
    ) {
        let b = &mut batch.bytes;
        b.extend_from_slice(b",\n{\"ph\":\"");
        b.extend_from_slice(ph);
        b.extend_from_slice(b"\",\"cat\":\"");
        b.extend_from_slice(cat);
        b.extend_from_slice(b"\",\"name\":");
        match name {
            SpanName::Id(id) => self.write_name(b, *id),
            SpanName::Owned(s) => json::write_str(b, s),
        }
        b.extend_from_slice(b",\"pid\":");
        json::write_int(b, self.header.pid);
        b.extend_from_slice(b",\"tid\":");
        json::write_int(b, self.threads[ti].meta.tid);
        b.extend_from_slice(b",\"ts\":");
        json::write_us(b, ns as i64 - self.header.start_mono_ns as i64);
    }

    /// The interned name `id` as a JSON string (from the writer's cache).
    pub(super) fn write_name(&mut self, b: &mut Vec<u8>, id: u32) {
        let id = id as usize;
        if id >= self.names.len() {
            for n in names::since(self.names.len()) {
                self.names.push(json::quoted(&n));
            }
        }
        match self.names.get(id) {
            Some(q) => b.extend_from_slice(q),
            None => b.extend_from_slice(b"\"<unknown>\""),
        }
    }
}

/// `,"args":{...}` merging the user's ready-made JSON object with flag fields.
pub(super) fn write_args(out: &mut Vec<u8>, user: Option<&str>, flags: &[(&str, &str)]) {
    let user = user.map(str::trim).filter(|u| u.len() > 2);
    // `u` is `{...}` with at least one member: splice its inside.
    let members =
        user.map(|u| move |out: &mut Vec<u8>| out.extend_from_slice(&u.as_bytes()[1..u.len() - 1]));
    write_args_with(out, flags, members);
}

/// `,"args":{<flags>,<members>}`, where `members` writes one or more
/// `"key":value` members; nothing when there are neither.
pub(super) fn write_args_with(
    out: &mut Vec<u8>,
    flags: &[(&str, &str)],
    members: Option<impl FnOnce(&mut Vec<u8>)>,
) {
    if members.is_none() && flags.is_empty() {
        return;
    }
    out.extend_from_slice(b",\"args\":{");
    for (i, (k, v)) in flags.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json::write_str(out, k);
        out.push(b':');
        out.extend_from_slice(v.as_bytes());
    }
    if let Some(m) = members {
        if !flags.is_empty() {
            out.push(b',');
        }
        m(out);
    }
    out.push(b'}');
}
