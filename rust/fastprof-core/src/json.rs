//! Small, allocation-free JSON formatting helpers for the writer's hot loop:
//! escaped strings, integers, counter values, and timestamps in Kineto's
//! convention (µs relative to `baseTimeNanoseconds`, exactly three decimals,
//! formatted from integer ns so no float ever rounds a timestamp).

/// Append `s` as a JSON string literal (with quotes).
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => {
                out.extend_from_slice(&bytes[start..i]);
                out.extend_from_slice(format!("\\u{b:04x}").as_bytes());
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// The JSON string literal for `s`, as a new buffer.
pub fn quoted(s: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(s.len() + 2);
    write_str(&mut v, s);
    v
}

/// Append `m` as `{"k": v, "k2": v2}`: a space after each colon and comma,
/// as Kineto writes `distributedInfo` and as Holistic Trace Analysis finds
/// a trace's rank (it searches the text for `"rank":` followed by
/// whitespace). Values are compact JSON.
pub fn write_spaced_object(out: &mut Vec<u8>, m: &serde_json::Map<String, serde_json::Value>) {
    out.push(b'{');
    for (i, (k, v)) in m.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        write_str(out, k);
        out.extend_from_slice(b": ");
        out.extend_from_slice(&serde_json::to_vec(v).unwrap_or_else(|_| b"null".to_vec()));
    }
    out.push(b'}');
}

/// Append an integer.
#[inline]
pub fn write_int<I: itoa::Integer>(out: &mut Vec<u8>, v: I) {
    let mut b = itoa::Buffer::new();
    out.extend_from_slice(b.format(v).as_bytes());
}

/// Append `ns` nanoseconds as microseconds with exactly three decimals.
#[inline]
pub fn write_us(out: &mut Vec<u8>, ns: i64) {
    let neg = ns < 0;
    let a = ns.unsigned_abs();
    if neg {
        out.push(b'-');
    }
    write_int(out, a / 1000);
    let frac = (a % 1000) as u16;
    out.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

/// Append a number. JSON has no NaN or infinities, and writing them as
/// `null` (as before) made a diverging loss vanish from a counter track: they
/// are written as the strings `"NaN"`, `"Infinity"` and `"-Infinity"`
/// (JavaScript's names), which every JSON parser accepts, viewers that plot
/// counters skip, and `fastprof.read_columns` reads back as floats.
pub fn write_f64(out: &mut Vec<u8>, v: f64) {
    use std::io::Write;
    if v.is_finite() {
        if v == v.trunc() && v.abs() < 1e15 {
            write_int(out, v as i64);
        } else {
            let _ = write!(out, "{v}");
        }
    } else if v.is_nan() {
        out.extend_from_slice(b"\"NaN\"");
    } else if v > 0.0 {
        out.extend_from_slice(b"\"Infinity\"");
    } else {
        out.extend_from_slice(b"\"-Infinity\"");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut v = Vec::new();
        f(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn strings_escape_like_json() {
        for x in [
            "plain",
            "q\"uote",
            "back\\slash",
            "nl\nx",
            "ctl\u{1}x",
            "ünï",
            "",
        ] {
            let out = s(|o| write_str(o, x));
            let back: String = serde_json::from_str(&out).unwrap();
            assert_eq!(back, x);
        }
    }

    #[test]
    fn microseconds_have_three_decimals() {
        assert_eq!(s(|o| write_us(o, 0)), "0.000");
        assert_eq!(s(|o| write_us(o, 1)), "0.001");
        assert_eq!(s(|o| write_us(o, 1_234_567)), "1234.567");
        assert_eq!(s(|o| write_us(o, 5_000)), "5.000");
        assert_eq!(s(|o| write_us(o, -1_500)), "-1.500");
        assert_eq!(s(|o| write_us(o, i64::MAX)), "9223372036854775.807");
    }

    #[test]
    fn floats_are_valid_json() {
        assert_eq!(s(|o| write_f64(o, 2.0)), "2");
        assert_eq!(s(|o| write_f64(o, 0.25)), "0.25");
        assert_eq!(s(|o| write_f64(o, f64::NAN)), "\"NaN\"");
        assert_eq!(s(|o| write_f64(o, f64::INFINITY)), "\"Infinity\"");
        assert_eq!(s(|o| write_f64(o, f64::NEG_INFINITY)), "\"-Infinity\"");
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let text = s(|o| write_f64(o, v));
            assert!(
                serde_json::from_str::<serde_json::Value>(&text).is_ok(),
                "{text}"
            );
        }
        let big = s(|o| write_f64(o, 1e300));
        assert_eq!(serde_json::from_str::<f64>(&big).unwrap(), 1e300);
    }
}
