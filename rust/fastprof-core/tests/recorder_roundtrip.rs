//! Writes a trace through the real recorder (threads, rings, writer, gzip)
//! and reads it back with the core's reader: counts, nesting, time format.

use fastprof_core::offline::trace::reader;
use fastprof_core::runtime::config::Config;
use fastprof_core::runtime::record::Extra;
use fastprof_core::runtime::session::Session;
use fastprof_core::runtime::{names, registry};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;

/// The recorder is process-wide: tests in this file take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fastprof-core-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn events(doc: &Value) -> &Vec<Value> {
    doc["traceEvents"].as_array().expect("traceEvents")
}

#[test]
fn threads_spans_roundtrip() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("roundtrip");
    let mut session = Session::start(Config {
        trace_dir: dir.clone(),
        flush_interval_s: 0.05,
        ..Config::default()
    })
    .unwrap();
    let outer = names::intern("outer").unwrap();
    let inner = names::intern("inner").unwrap();
    let handles: Vec<_> = (0..3)
        .map(|t| {
            std::thread::spawn(move || {
                let mut namer = || format!("worker-{t}");
                for i in 0..10_000u32 {
                    registry::begin(outer, &mut namer);
                    if i % 100 == 0 {
                        let x = Box::new(Extra {
                            name: None,
                            args_json: Some(format!("{{\"i\":{i}}}").into()),
                            ..Default::default()
                        });
                        registry::begin_extra(inner, x, &mut namer);
                    } else {
                        registry::begin(inner, &mut namer);
                    }
                    registry::end(false);
                    registry::end(false);
                }
                registry::counter(outer, 1.5, &mut namer);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let report = session.stop().unwrap();
    assert_eq!(report.dropped, 0);
    assert_eq!(report.segments.len(), 1);
    let doc = reader::read_trace(&report.segments[0]).unwrap();
    assert!(!doc.salvaged);
    let evs = events(&doc.value);
    let mut per: HashMap<(String, String), usize> = HashMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "X") {
        *per.entry((e["name"].as_str().unwrap().into(), e["tid"].to_string()))
            .or_default() += 1;
    }
    assert_eq!(per.len(), 6, "{per:?}");
    assert!(per.values().all(|&n| n == 10_000));
    let with_args = evs.iter().filter(|e| e["args"]["i"].is_number()).count();
    assert_eq!(with_args, 300);
    let names: Vec<&str> = evs
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    for t in 0..3 {
        assert!(names.contains(&format!("worker-{t}").as_str()));
    }
    assert_eq!(evs.iter().filter(|e| e["ph"] == "C").count(), 3);
    assert!(doc.value["baseTimeNanoseconds"].as_u64().unwrap() > 1_600_000_000_000_000_000);
    assert_eq!(doc.value["otherData"]["final"], Value::Bool(true));
    assert_eq!(doc.value["otherData"]["drops"]["total"], 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tiny_ring_counts_every_drop_and_keeps_nesting() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("drops");
    let mut session = Session::start(Config {
        trace_dir: dir.clone(),
        buffer_size: 16,
        buffer_growth: 0,
        flush_interval_s: 10.0,
        ..Config::default()
    })
    .unwrap();
    let a = names::intern("a").unwrap();
    let b = names::intern("b").unwrap();
    let mut namer = || "main".to_string();
    let issued = 5_000u64;
    for _ in 0..issued / 2 {
        registry::begin(a, &mut namer);
        registry::begin(b, &mut namer);
        registry::end(false);
        registry::end(false);
    }
    let report = session.stop().unwrap();
    let doc = reader::read_trace(&report.segments[0]).unwrap();
    let spans: Vec<&Value> = events(&doc.value)
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect();
    assert!(report.dropped > 0);
    assert_eq!(spans.len() as u64 + report.dropped, issued);
    // every recorded "b" lies inside a recorded "a"
    let bs = spans.iter().filter(|e| e["name"] == "b").count();
    let as_ = spans.iter().filter(|e| e["name"] == "a").count();
    assert!(bs <= as_);
    assert_eq!(doc.value["otherData"]["drops"]["total"], report.dropped);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn open_span_is_closed_at_stop_and_marked() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("unclosed");
    let mut session = Session::start(Config {
        trace_dir: dir.clone(),
        ..Config::default()
    })
    .unwrap();
    let a = names::intern("left-open").unwrap();
    registry::begin(a, &mut || "main".into());
    let report = session.stop().unwrap();
    registry::end(false); // after stop: a no-op
    assert_eq!(report.unclosed_spans, 1);
    let doc = reader::read_trace(&report.segments[0]).unwrap();
    let e = events(&doc.value)
        .iter()
        .find(|e| e["name"] == "left-open")
        .unwrap();
    assert_eq!(e["args"]["unclosed"], Value::Bool(true));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn active_while_recording_paused_or_not_until_disabled_or_stopped() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("active");
    let config = || Config {
        trace_dir: dir.clone(),
        ..Config::default()
    };
    let mut first = Session::start(config()).unwrap();
    assert!(first.is_active());
    first.pause().unwrap();
    assert!(first.is_active() && first.is_paused());
    first.resume().unwrap();
    // A failure disables a session without stopping it.
    first.shared().disable();
    assert!(!first.is_active() && !first.is_paused());
    first.stop().unwrap();
    assert!(!first.is_active());
    let mut second = Session::start(config()).unwrap();
    assert!(second.is_active() && !first.is_active());
    second.stop().unwrap();
    assert!(!second.is_active());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn second_start_is_refused() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("twice");
    let mut session = Session::start(Config {
        trace_dir: dir.clone(),
        ..Config::default()
    })
    .unwrap();
    let again = Session::start(Config {
        trace_dir: dir.clone(),
        ..Config::default()
    });
    assert!(matches!(
        again,
        Err(fastprof_core::CoreError::AlreadyRunning { .. })
    ));
    session.stop().unwrap();
    assert!(matches!(
        session.stop(),
        Err(fastprof_core::CoreError::NotRunning)
    ));
    let _ = std::fs::remove_dir_all(dir);
}

/// A training step's args are written by the writer thread from the step
/// context the training thread sends when it changes: two threads with
/// their own epochs and actions, across a pause (which records no step
/// but must not lose the context) and a second session (a new ring).
#[test]
fn step_args_are_formatted_on_the_writer_thread() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let step = names::intern("step").unwrap();
    let actions = [
        names::intern("none").unwrap(),
        names::intern("active \"x\"").unwrap(),
    ];
    for round in 0..2 {
        let dir = tmpdir(&format!("steps-{round}"));
        let mut session = Session::start(Config {
            trace_dir: dir.clone(),
            flush_interval_s: 0.05,
            ..Config::default()
        })
        .unwrap();
        let mut namer = || "main".to_string();
        let mut expected = Vec::new();
        let mut batch = 0u64;
        for epoch in 0..3u64 {
            for bie in 0..7u64 {
                let action = actions[((bie / 3) % 2) as usize];
                let args = registry::StepArgs {
                    epoch,
                    batch,
                    batch_in_epoch: bie,
                    action,
                };
                let paused = epoch == 1 && bie == 2;
                if paused {
                    session.pause().unwrap();
                }
                let t0 = fastprof_core::runtime::clock::ticks();
                registry::step_complete(step, t0, args, &mut namer);
                if paused {
                    session.resume().unwrap();
                } else {
                    expected.push((epoch, batch, bie, names::get(action).unwrap().to_string()));
                }
                batch += 1;
            }
        }
        let report = session.stop().unwrap();
        assert_eq!(report.dropped, 0);
        let doc = reader::read_trace(&report.segments[0]).unwrap();
        let got: Vec<_> = events(&doc.value)
            .iter()
            .filter(|e| e["ph"] == "X" && e["name"] == "step")
            .map(|e| {
                let a = &e["args"];
                assert_eq!(a.as_object().unwrap().len(), 4, "{a}");
                (
                    a["epoch"].as_u64().unwrap(),
                    a["batch"].as_u64().unwrap(),
                    a["batch_in_epoch"].as_u64().unwrap(),
                    a["action"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(got, expected);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
