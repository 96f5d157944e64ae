//! Strict JSON syntax of one value, in one iterative pass with no
//! allocation: what decides whether an event may be copied through.
//!
//! The scanner's walk (`walk` in the parent module) only delimits a value:
//! bracket balance, strings, escapes, stray bytes. That lets through text
//! every JSON parser refuses: trailing commas (`{"a":1,}`, `[1,]`), a missing
//! comma or colon, misspelt literals (`tru`), numbers JSON does not allow
//! (`+5`, `.5`, `01`, `1.`), a key that is not a string. Copied through, one
//! such event makes a whole merged file unreadable. [`Fields::parse`]
//! (`fields.rs`), which every consumer that copies or reads events by field
//! already runs over each whole event, steps over values with [`value`], so
//! the check costs no pass of its own; [`check`] is the same for a whole text.
//!
//! [`Fields::parse`]: super::Fields::parse
//!
//! Bytes >= 0x80 inside strings are accepted as they are: invalid UTF-8 is
//! repaired (U+FFFD) by whoever copies or parses the event. Nesting is capped
//! at [`MAX_DEPTH`] so that a merged event stays readable by parsers with a
//! recursion limit (serde_json: 128; CPython's json: the interpreter's).

use super::INSIDE;

/// Deepest nesting of objects and arrays accepted inside one value (the
/// value itself counts as level 1).
pub const MAX_DEPTH: usize = 128;

/// Where a check failed (an offset in the text) and why.
pub type Invalid = (usize, &'static str);

/// `Ok` when `text` is exactly one JSON value (blanks around it allowed);
/// else the offset in `text` of the first byte at fault and why.
pub fn check(text: &[u8]) -> Result<(), Invalid> {
    let end = value(text, ws(text, 0), MAX_DEPTH)?;
    let i = ws(text, end);
    if i == text.len() {
        Ok(())
    } else {
        Err((i, "text after the end of the value"))
    }
}

/// The JSON value starting at `text[i]`, nested at most `max_depth` levels
/// (at most [`MAX_DEPTH`]): the index just past it, or where and why it is
/// not JSON.
pub fn value(text: &[u8], mut i: usize, max_depth: usize) -> Result<usize, Invalid> {
    let max_depth = max_depth.min(MAX_DEPTH);
    // Bit d of `arrays` says whether the container at depth d is an array.
    let mut arrays: u128 = 0;
    let mut depth = 0usize;
    'value: loop {
        // A value starts at `i`.
        match text.get(i) {
            None => return Err((i, "the text ends where a value should be")),
            Some(&b) if b == b'{' || b == b'[' => {
                if depth == max_depth {
                    return Err((i, "nested deeper than 128 levels"));
                }
                let is_array = b == b'[';
                if is_array {
                    arrays |= 1u128 << depth;
                } else {
                    arrays &= !(1u128 << depth);
                }
                depth += 1;
                i = ws(text, i + 1);
                match (text.get(i), is_array) {
                    (Some(b']'), true) | (Some(b'}'), false) => {
                        // Empty: closed at once.
                        depth -= 1;
                        i += 1;
                    }
                    (_, true) => continue 'value,
                    (_, false) => {
                        i = key(text, i)?;
                        continue 'value;
                    }
                }
            }
            Some(b'"') => i = string(text, i)?,
            Some(b'-' | b'0'..=b'9') => i = number(text, i)?,
            Some(b't') => i = literal(text, i, b"true")?,
            Some(b'f') => i = literal(text, i, b"false")?,
            Some(b'n') => i = literal(text, i, b"null")?,
            Some(b']' | b'}') => return Err((i, "trailing comma or missing value")),
            Some(_) => return Err((i, "expected a value")),
        }
        // After a value: a separator or the end of its container(s).
        loop {
            if depth == 0 {
                return Ok(i);
            }
            i = ws(text, i);
            let in_array = arrays >> (depth - 1) & 1 == 1;
            match (text.get(i), in_array) {
                (Some(b','), true) => {
                    i = ws(text, i + 1);
                    continue 'value;
                }
                (Some(b','), false) => {
                    i = ws(text, i + 1);
                    if text.get(i) == Some(&b'}') {
                        return Err((i, "trailing comma in an object"));
                    }
                    i = key(text, i)?;
                    continue 'value;
                }
                (Some(b']'), true) | (Some(b'}'), false) => {
                    depth -= 1;
                    i += 1;
                }
                (None, _) => return Err((i, "the text ends inside an object or array")),
                (_, true) => return Err((i, "expected `,` or `]` (missing comma?)")),
                (_, false) => return Err((i, "expected `,` or `}` (missing comma?)")),
            }
        }
    }
}

#[inline(always)]
pub(super) fn ws(text: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = text.get(i) {
        i += 1;
    }
    i
}

/// A key, blanks and `:` at `i`; the index of the value after them.
#[inline(always)]
pub(super) fn key(text: &[u8], i: usize) -> Result<usize, Invalid> {
    if text.get(i) != Some(&b'"') {
        return Err((i, "expected a string key"));
    }
    let i = ws(text, string(text, i)?);
    if text.get(i) != Some(&b':') {
        return Err((i, "expected `:` after a key (missing colon?)"));
    }
    Ok(ws(text, i + 1))
}

/// The string opening at `open`; the index just past its closing quote.
#[inline(always)]
pub(super) fn string(text: &[u8], open: usize) -> Result<usize, Invalid> {
    let mut i = open + 1;
    loop {
        // Eight bytes at a time while none of them is `"`, `\` or a control
        // byte (most strings are names and keys of 8-40 bytes).
        while let Some(chunk) = text.get(i..i + 8) {
            let w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            if special8(w) {
                break;
            }
            i += 8;
        }
        while i < text.len() && INSIDE[text[i] as usize] == 0 {
            i += 1;
        }
        match text.get(i) {
            None => return Err((i, "the text ends inside a string")),
            Some(b'"') => return Ok(i + 1),
            Some(b'\\') => {
                let at = i;
                let ok = match text.get(i + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                        i += 2;
                        true
                    }
                    Some(b'u') => {
                        let hex = text.get(i + 2..i + 6);
                        i += 6;
                        hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
                    }
                    _ => false,
                };
                if !ok {
                    return Err((at, "invalid escape in a string"));
                }
            }
            Some(_) => return Err((i, "control character in a string")),
        }
    }
}

/// Whether one of the 8 bytes of `w` is `"`, `\\` or below 0x20 (the
/// classic zero-byte test, per byte: `x - 1` borrows into the top bit only
/// from a zero byte, and never for bytes >= 0x80 given `!x`).
#[inline(always)]
fn special8(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGHS;
    zero(w ^ (ONES * b'"' as u64)) | zero(w ^ (ONES * b'\\' as u64)) | below_space != 0
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` at `i`; the index past it.
#[inline(always)]
fn number(text: &[u8], mut i: usize) -> Result<usize, Invalid> {
    let start = i;
    let digits = |from: usize| {
        text[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    if text[i] == b'-' {
        i += 1;
    }
    match digits(i) {
        0 => return Err((start, "not a JSON number")),
        1 => i += 1,
        k if text[i] == b'0' => return Err((i + k - 1, "a number with a leading zero")),
        k => i += k,
    }
    if text.get(i) == Some(&b'.') {
        match digits(i + 1) {
            0 => return Err((start, "not a JSON number (no digit after `.`)")),
            k => i += 1 + k,
        }
    }
    if let Some(b'e' | b'E') = text.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = text.get(i) {
            i += 1;
        }
        match digits(i) {
            0 => return Err((start, "not a JSON number (no digit in the exponent)")),
            k => i += k,
        }
    }
    Ok(i)
}

#[inline(always)]
fn literal(text: &[u8], i: usize, word: &'static [u8]) -> Result<usize, Invalid> {
    if text[i..].starts_with(word) {
        Ok(i + word.len())
    } else {
        Err((i, "not a JSON literal (true, false or null)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_json() {
        for ok in [
            r#"{}"#,
            r#"[]"#,
            r#" {"a" : [1, -0.5e+3, 0, 2E9, true, false, null, "x\u00e9\n\"", {}], "b":{"c":[]}} "#,
            r#"{"name":"caf\u00e9 \\ \/","ts":1700000000000000.123,"args":{"k":[[[]]]}}"#,
            "0",
            "-0.0e-0",
        ] {
            assert_eq!(check(ok.as_bytes()), Ok(()), "{ok}");
        }
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(check(deep.as_bytes()), Ok(()));
        // Raw bytes >= 0x80 in strings are left to the UTF-8 repair.
        assert_eq!(check(b"{\"raw\":\"\xff\xfe bytes\"}"), Ok(()));
    }

    #[test]
    fn refuses_what_json_parsers_refuse() {
        for (bad, at) in [
            (r#"{"a":1,}"#, 7),
            (r#"{"a":[1,2,]}"#, 10),
            (r#"{"a":{"b":1,},"c":2}"#, 12),
            (r#"{"a":1 "b":2}"#, 7),
            (r#"{"a" 1}"#, 5),
            (r#"{"a":tru}"#, 5),
            (r#"{"a":+5}"#, 5),
            (r#"{"a":.5}"#, 5),
            (r#"{"a":01}"#, 6),
            (r#"{"a":1.}"#, 5),
            (r#"{"a":1e}"#, 5),
            (r#"{"a":-}"#, 5),
            (r#"{a:1}"#, 1),
            (r#"{"a":1}}"#, 7),
            (r#"{"a":1"#, 6),
            (r#"{"a":"x\q"}"#, 7),
            (r#"{"a":"\u12"}"#, 6),
            ("{\"a\":\"x\ty\"}", 7),
            (r#"{"a":[1 2]}"#, 8),
            (r#"{"a":1,,"b":2}"#, 7),
            (r#"{"a":1x}"#, 6),
            (r#"{"a":NaN}"#, 5),
            (r#"{"a":[}"#, 6),
            ("", 0),
        ] {
            let got = check(bad.as_bytes());
            assert!(got.is_err(), "{bad} accepted");
            assert_eq!(got.unwrap_err().0, at, "{bad}: {got:?}");
        }
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(
            check(deep.as_bytes()),
            Err((MAX_DEPTH, "nested deeper than 128 levels"))
        );
    }

    #[test]
    fn special8_finds_quote_backslash_and_control_bytes_anywhere() {
        for pos in 0..8 {
            for b in (0u8..0x20).chain([b'"', b'\\']) {
                let mut bytes = *b"abcdefgh";
                bytes[pos] = b;
                assert!(special8(u64::from_le_bytes(bytes)), "{b:#x} at {pos}");
            }
        }
        for b in (0x20u8..=0xff).filter(|b| *b != b'"' && *b != b'\\') {
            assert!(!special8(u64::from_le_bytes([b; 8])), "{b:#x}");
            let mut bytes = [b; 8];
            bytes[3] = b'x';
            assert!(!special8(u64::from_le_bytes(bytes)), "{b:#x}");
        }
    }

    #[test]
    fn agrees_with_serde_json_on_syntax() {
        // Mutations of one event: every single-byte deletion and a few
        // insertions; serde_json (syntax only, through IgnoredAny) is the oracle.
        let base = br#"{"ph":"X","name":"a\"b","ts":1.5,"dur":-2e3,"args":{"x":[true,null,0,{}]}}"#;
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for i in 0..base.len() {
            let mut v = base.to_vec();
            v.remove(i);
            cases.push(v);
            for ins in [b',', b':', b'0', b' ', b'"', b'}', b'.'] {
                let mut v = base.to_vec();
                v.insert(i, ins);
                cases.push(v);
            }
        }
        for c in cases {
            let serde = std::str::from_utf8(&c)
                .ok()
                .and_then(|s| serde_json::from_str::<serde::de::IgnoredAny>(s).ok())
                .is_some();
            assert_eq!(
                check(&c).is_ok(),
                serde,
                "{}: {:?}",
                String::from_utf8_lossy(&c),
                check(&c)
            );
        }
    }
}
