//! Conversions between Python values and JSON: call args to the ready-made
//! JSON object a record carries, and parsed trace documents back to Python.

use fastprof_core::json;
use fastprof_core::runtime::registry;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};
use serde_json::Value;
use std::borrow::Cow;

/// The text of a str, with what UTF-8 cannot hold (lone surrogates, as
/// `os.fsdecode` makes from undecodable bytes) replaced by U+FFFD and counted.
pub fn text<'a>(s: &'a Bound<'_, PyString>) -> Cow<'a, str> {
    match s.to_cow() {
        Ok(t) => t,
        Err(_) => {
            registry::note_replaced();
            let bytes = s
                .call_method1("encode", ("utf-8", "surrogatepass"))
                .and_then(|b| b.extract::<Vec<u8>>())
                .unwrap_or_default();
            Cow::Owned(one_replacement_per_surrogate(&bytes))
        }
    }
}

/// UTF-8 text from `bytes` (Python's "surrogatepass" encoding of a str):
/// each encoded lone surrogate (ED A0..BF 80..BF) becomes one U+FFFD, as any
/// other invalid byte does (a per-byte lossy decode would give three).
fn one_replacement_per_surrogate(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                out.push('\u{FFFD}');
                let surrogate = bad.len() >= 3
                    && bad[0] == 0xED
                    && (0xA0..=0xBF).contains(&bad[1])
                    && (0x80..=0xBF).contains(&bad[2]);
                let skip = if surrogate {
                    3
                } else {
                    e.error_len().unwrap_or(bad.len())
                };
                rest = &bad[skip..];
            }
        }
    }
}

/// `str(v)`, or a placeholder (counted) when `__str__` raises.
fn display(v: &Bound<'_, PyAny>) -> String {
    match v.str() {
        Ok(s) => text(&s).into_owned(),
        Err(_) => {
            registry::note_replaced();
            format!(
                "<unprintable {}>",
                v.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            )
        }
    }
}

/// Append one Python value as JSON; anything that is not a JSON scalar is
/// written as its `str()`, so args never make a call fail.
fn write_value(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) {
    if v.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(b) = v.cast::<PyBool>() {
        out.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    } else if v.is_instance_of::<PyInt>() {
        match v.extract::<i64>() {
            Ok(i) => json::write_int(out, i),
            Err(_) => json::write_str(out, &display(v)),
        }
    } else if let Ok(f) = v.cast::<PyFloat>() {
        json::write_f64(out, f.value());
    } else if let Ok(s) = v.cast::<PyString>() {
        json::write_str(out, &text(s));
    } else {
        json::write_str(out, &display(v));
    }
}

/// `{"k":v,...}` for a dict of args; `None` for an empty one.
pub fn args_json(args: &Bound<'_, PyDict>) -> Option<Box<str>> {
    if args.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(16 * args.len() + 2);
    out.push(b'{');
    for (i, (k, v)) in args.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json::write_str(&mut out, &display(&k));
        out.push(b':');
        write_value(&mut out, &v);
    }
    out.push(b'}');
    // Every byte came from valid UTF-8 strings or ASCII.
    Some(String::from_utf8(out).unwrap_or_default().into_boxed_str())
}

/// `{"series":value,...}` for a counter mapping. Entries whose value is not
/// a number are left out and counted; `None` when the mapping cannot be read
/// (its `items()` raised) or nothing in it is a number.
pub fn counter_json(values: &Bound<'_, PyAny>) -> Option<Box<str>> {
    let mut out = Vec::with_capacity(64);
    out.push(b'{');
    let Ok(items) = values.call_method0("items").and_then(|i| i.try_iter()) else {
        registry::note_replaced();
        return None;
    };
    let mut n = 0;
    for item in items {
        let Ok((k, v)) = item.and_then(|i| i.extract::<(Bound<'_, PyAny>, f64)>()) else {
            registry::note_replaced();
            continue;
        };
        if n > 0 {
            out.push(b',');
        }
        n += 1;
        json::write_str(&mut out, &display(&k));
        out.push(b':');
        json::write_f64(&mut out, v);
    }
    out.push(b'}');
    (n > 0).then(|| String::from_utf8(out).unwrap_or_default().into_boxed_str())
}

/// A parsed JSON value as Python objects.
pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(to_py(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}
