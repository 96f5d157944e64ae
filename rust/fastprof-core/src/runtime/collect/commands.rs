//! Requests the writer thread answers between drains ([`Command`]): dump the in-memory window
//! as a trace, count a file written elsewhere under the disk cap, hold or release bytes for one
//! being written.

use super::writer::Collector;
use super::Command;
use crate::error::CoreError;
use crate::error::Result;
use crate::runtime::clock;
use crate::runtime::sink::window::{is_over_limit, DumpInfo};
use crate::runtime::sink::Batch;
use std::io;

impl Collector {
    pub(super) fn answer_commands(&mut self, stopped: bool) {
        let cmds = std::mem::take(
            &mut *self
                .st
                .shared
                .commands
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for c in cmds {
            match c {
                Command::Dump { path, reply } => {
                    let r = if stopped {
                        Err(CoreError::NotRunning)
                    } else {
                        self.dump(&path)
                    };
                    let _ = reply.send(r);
                }
                Command::CountFile {
                    path,
                    kind,
                    release,
                    reply,
                } => {
                    for s in self.sinks.iter_mut() {
                        s.release(release);
                    }
                    let why = if stopped {
                        None
                    } else {
                        self.adopt_file(&path, &kind)
                    };
                    let _ = reply.send(why);
                }
                Command::Hold { bytes, reply } => {
                    // Stopped: the cap ends with the recording (count_file
                    // counts nothing then either).
                    let granted = stopped || self.sinks.iter_mut().all(|s| s.hold(bytes));
                    let _ = reply.send(granted);
                }
                Command::Release { bytes } => {
                    for s in self.sinks.iter_mut() {
                        s.release(bytes);
                    }
                }
            }
        }
    }

    /// Count a file under the disk cap (the segment sink keeps it); why, when
    /// the cap deleted it at once.
    pub(super) fn adopt_file(&mut self, path: &std::path::Path, kind: &str) -> Option<String> {
        let mut why = None;
        for s in self.sinks.iter_mut() {
            why = why.or(s.adopt_file(path, kind));
        }
        why
    }

    pub(super) fn dump(&mut self, path: &std::path::Path) -> Result<DumpInfo> {
        self.drain_all().map_err(|e| CoreError::io(path, e))?;
        let Some(w) = self.window else {
            return Err(CoreError::io(
                path,
                io::Error::other("the in-memory window is not running"),
            ));
        };
        // Open spans, closed at this instant (they stay open in the session).
        let now = self.st.cal.to_ns(clock::ticks()).max(clock::monotonic_ns());
        let mut open = Batch::default();
        let mut n_open = 0;
        for i in 0..self.st.threads.len() {
            let stack = std::mem::take(&mut self.st.threads[i].stack);
            for o in &stack {
                self.st
                    .format_span(&mut open, i, o, now, &[("unclosed", "true")]);
                n_open += 1;
            }
            self.st.threads[i].stack = stack;
            open.end_chunk(&self.st.threads[i].meta);
        }
        // Planned within what the disk cap leaves, and room made for it
        // first: the disk stays under the cap while the file is written,
        // not only once it is counted.
        let want = self.sinks[w]
            .as_window()
            .map_or(0, |win| win.memory_bytes() + open.bytes.len() as u64);
        let mut room = self
            .sinks
            .iter_mut()
            .filter_map(|s| s.room_for_file(want))
            .min();
        let mut info = loop {
            let window = self.sinks[w]
                .as_window()
                .expect("the window index points at the window sink");
            let plan = match window.plan_dump(&open, &self.st, room) {
                Ok(plan) => plan,
                Err(why) => {
                    return Ok(DumpInfo {
                        path: path.to_path_buf(),
                        open_spans: n_open,
                        skipped: Some(why),
                        ..DumpInfo::default()
                    })
                }
            };
            if let Some(limit) = plan.limit {
                for s in self.sinks.iter_mut() {
                    s.make_room(limit);
                }
            }
            let window = self.sinks[w]
                .as_window()
                .expect("the window index points at the window sink");
            match window.dump(path, &open, &plan) {
                Ok(info) => break info,
                // Compressed larger than planned: fewer events, same room.
                Err(e) if is_over_limit(&e) => room = plan.tighter(),
                Err(e) => return Err(CoreError::io(path, e)),
            }
        };
        info.open_spans = n_open;
        // Written for this rank: under the same disk cap as the segments.
        info.deleted = self.adopt_file(path, "flight");
        Ok(info)
    }
}
