//! Conversions between Python values and JSON: call args to the ready-made
//! JSON object a record carries, and parsed trace documents back to Python.

use fastprof_core::json;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};
use serde_json::Value;

/// Append one Python value as JSON; anything that is not a JSON scalar is
/// written as its `str()`, so args never make a call fail.
fn write_value(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> PyResult<()> {
    if v.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(b) = v.cast::<PyBool>() {
        out.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    } else if v.is_instance_of::<PyInt>() {
        match v.extract::<i64>() {
            Ok(i) => json::write_int(out, i),
            Err(_) => json::write_str(out, &v.str()?.to_cow()?),
        }
    } else if let Ok(f) = v.cast::<PyFloat>() {
        json::write_f64(out, f.value());
    } else if let Ok(s) = v.cast::<PyString>() {
        json::write_str(out, &s.to_cow()?);
    } else {
        json::write_str(out, &v.str()?.to_cow()?);
    }
    Ok(())
}

/// `{"k":v,...}` for a dict of args; `None` for an empty one.
pub fn args_json(args: &Bound<'_, PyDict>) -> PyResult<Option<Box<str>>> {
    if args.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(16 * args.len() + 2);
    out.push(b'{');
    for (i, (k, v)) in args.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json::write_str(&mut out, &k.str()?.to_cow()?);
        out.push(b':');
        write_value(&mut out, &v)?;
    }
    out.push(b'}');
    // Every byte came from valid UTF-8 strings or ASCII.
    Ok(Some(
        String::from_utf8(out).unwrap_or_default().into_boxed_str(),
    ))
}

/// `{"series":value,...}` for a counter mapping; values must be numbers.
pub fn counter_json(values: &Bound<'_, PyAny>) -> PyResult<Box<str>> {
    let mut out = Vec::with_capacity(64);
    out.push(b'{');
    let items = values.call_method0("items")?;
    for (i, item) in items.try_iter()?.enumerate() {
        let (k, v): (Bound<'_, PyAny>, f64) = item?.extract().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err("counter mapping values must be numbers")
        })?;
        if i > 0 {
            out.push(b',');
        }
        json::write_str(&mut out, &k.str()?.to_cow()?);
        out.push(b':');
        json::write_f64(&mut out, v);
    }
    out.push(b'}');
    Ok(String::from_utf8(out).unwrap_or_default().into_boxed_str())
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
