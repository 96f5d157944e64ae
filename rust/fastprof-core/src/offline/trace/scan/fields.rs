//! [`Fields`]: a shallow view of one event object (byte ranges of the keys
//! merging needs), and the number parsers for timestamps and ids, which turn
//! decimal text into integers without going through a float.

use super::validate::{self, Invalid};
use super::{is_token_byte, valid_scalar, CLOSE, INSIDE, OPEN, OUTSIDE, QUOTE};
use std::borrow::Cow;
use std::ops::Range;

/// Shallow view of one event object: byte ranges (within the event slice) of
/// the values of these top-level keys, when present (the last one wins, as in
/// serde_json). Nested values are stepped over, never parsed.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    pub ph: Option<Range<usize>>,
    pub pid: Option<Range<usize>>,
    pub tid: Option<Range<usize>>,
    pub ts: Option<Range<usize>>,
    pub dur: Option<Range<usize>>,
    pub name: Option<Range<usize>>,
    pub cat: Option<Range<usize>>,
    pub id: Option<Range<usize>>,
    pub id2: Option<Range<usize>>,
    pub bind_id: Option<Range<usize>>,
    pub args: Option<Range<usize>>,
}

/// Longest span duration taken as real: about 31.7 years. Anything longer
/// is a writer's bug (or a hostile file), and `ts + dur` stays far from
/// overflowing i64 for any epoch timestamp.
pub const MAX_DUR_NS: i64 = 1_000_000_000_000_000_000;

impl Fields {
    /// The event's `dur` in integer ns for a reader that must not take a
    /// bad one as 0 s: 0 when absent (an instant-long span, as viewers read
    /// it), None when present but negative, unreadable, not a number in
    /// range or longer than [`MAX_DUR_NS`] (a span to leave out and count).
    pub fn dur_checked(&self, raw: &[u8]) -> Option<i64> {
        match self.dur.clone() {
            None => Some(0),
            Some(r) => parse_us_to_ns(&raw[r]).filter(|d| (0..=MAX_DUR_NS).contains(d)),
        }
    }

    /// The event's `ts` in integer ns (see [`parse_us_to_ns`]); None when it
    /// has none or it is not a number in range. `raw` is the event these
    /// fields were parsed from.
    pub fn ts_ns(&self, raw: &[u8]) -> Option<i64> {
        self.ts.clone().and_then(|r| parse_us_to_ns(&raw[r]))
    }

    /// The event's `dur` in integer ns: 0 when absent or unreadable, and a
    /// negative duration counts as 0, so `ts + dur` is never before `ts`.
    pub fn dur_ns(&self, raw: &[u8]) -> i64 {
        self.dur
            .clone()
            .and_then(|r| parse_us_to_ns(&raw[r]))
            .unwrap_or(0)
            .max(0)
    }

    /// None if `event` is not one object with string keys and well-formed
    /// top-level values (nested values are only checked for balance): the
    /// fast view for reading fields. Use [`Fields::parse_checked`] before
    /// copying an event anywhere that must stay valid JSON.
    pub fn parse(event: &[u8]) -> Option<Fields> {
        Self::parse_with::<false>(event).ok()
    }

    /// The fields of `event`, or where and why it is not one JSON object:
    /// the whole event is checked against the JSON grammar on the way (a
    /// trailing comma, a missing comma or colon, `tru`, `+5`, `.5`, `01`,
    /// nesting past [`validate::MAX_DEPTH`]), in the one pass that locates
    /// the fields, so whoever copies an event it accepts copies valid JSON.
    /// About half the speed of [`Fields::parse`] (it looks at every token).
    pub fn parse_checked(event: &[u8]) -> Result<Fields, Invalid> {
        Self::parse_with::<true>(event)
    }

    fn parse_with<const STRICT: bool>(event: &[u8]) -> Result<Fields, Invalid> {
        let mut f = Fields::default();
        let mut i = skip_ws(event, 0);
        if event.get(i) != Some(&b'{') {
            return Err((i, "not an object"));
        }
        i = skip_ws(event, i + 1);
        let end_of = |i: usize| {
            let j = skip_ws(event, i);
            if j == event.len() {
                Ok(())
            } else {
                Err((j, "text after the end of the event"))
            }
        };
        if event.get(i) == Some(&b'}') {
            end_of(i + 1)?;
            return Ok(f);
        }
        loop {
            if event.get(i) != Some(&b'"') {
                return Err((i, "expected a string key"));
            }
            let key_end = if STRICT {
                validate::string(event, i)?
            } else {
                string_end(event, i).ok_or((i, "unreadable key"))?
            };
            let key = &event[i + 1..key_end - 1];
            i = skip_ws(event, key_end);
            if event.get(i) != Some(&b':') {
                return Err((i, "expected `:` after a key (missing colon?)"));
            }
            i = skip_ws(event, i + 1);
            let end = if STRICT {
                validate::value(event, i, validate::MAX_DEPTH - 1)?
            } else {
                value_end(event, i).ok_or((i, "unreadable value"))?
            };
            let slot = match key {
                b"ph" => &mut f.ph,
                b"pid" => &mut f.pid,
                b"tid" => &mut f.tid,
                b"ts" => &mut f.ts,
                b"dur" => &mut f.dur,
                b"name" => &mut f.name,
                b"cat" => &mut f.cat,
                b"id" => &mut f.id,
                b"id2" => &mut f.id2,
                b"bind_id" => &mut f.bind_id,
                b"args" => &mut f.args,
                _ => &mut None,
            };
            *slot = Some(i..end);
            i = skip_ws(event, end);
            match event.get(i) {
                Some(b',') => {
                    i = skip_ws(event, i + 1);
                    if event.get(i) == Some(&b'}') {
                        return Err((i, "trailing comma in an object"));
                    }
                }
                Some(b'}') => {
                    end_of(i + 1)?;
                    return Ok(f);
                }
                None => return Err((i, "the text ends inside the event")),
                Some(_) => return Err((i, "expected `,` or `}` (missing comma?)")),
            }
        }
    }
}

fn skip_ws(text: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = text.get(i) {
        i += 1;
    }
    i
}

/// Index just past the closing quote of the string opening at `open`.
fn string_end(text: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    loop {
        while i < text.len() && INSIDE[text[i] as usize] == 0 {
            i += 1;
        }
        match text.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => return None,
        }
    }
}

/// Index just past the value starting at `i`.
pub(crate) fn value_end(text: &[u8], i: usize) -> Option<usize> {
    match *text.get(i)? {
        b'"' => string_end(text, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < text.len() {
                match OUTSIDE[text[j] as usize] {
                    QUOTE => j = string_end(text, j)? - 1,
                    OPEN => depth += 1,
                    CLOSE => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let len = text[i..]
                .iter()
                .position(|&b| !is_token_byte(b))
                .unwrap_or(text.len() - i);
            valid_scalar(&text[i..i + len]).then_some(i + len)
        }
    }
}

/// Call `f(key, value)` for each top-level entry of the JSON object `obj`
/// (`key` between its quotes, escapes left as-is; `value` raw), stepping over
/// nested values without parsing them. False (after the entries before it)
/// if `obj` is not a well-formed object.
pub fn for_each_entry(obj: &[u8], mut f: impl FnMut(&[u8], &[u8])) -> bool {
    let mut i = skip_ws(obj, 0);
    if obj.get(i) != Some(&b'{') {
        return false;
    }
    i = skip_ws(obj, i + 1);
    if obj.get(i) == Some(&b'}') {
        return true;
    }
    loop {
        if obj.get(i) != Some(&b'"') {
            return false;
        }
        let Some(key_end) = string_end(obj, i) else {
            return false;
        };
        let key = &obj[i + 1..key_end - 1];
        i = skip_ws(obj, key_end);
        if obj.get(i) != Some(&b':') {
            return false;
        }
        i = skip_ws(obj, i + 1);
        let Some(end) = value_end(obj, i) else {
            return false;
        };
        f(key, &obj[i..end]);
        i = skip_ws(obj, end);
        match obj.get(i) {
            Some(b',') => i = skip_ws(obj, i + 1),
            Some(b'}') => return true,
            _ => return false,
        }
    }
}

/// The value of a JSON string token (between the quotes, escapes left as-is).
pub fn str_value(raw: &[u8]) -> Option<&[u8]> {
    match raw {
        [b'"', inner @ .., b'"'] => Some(inner),
        _ => None,
    }
}

/// A string token's text: borrowed when it has no escapes and is valid UTF-8
/// (the usual case), decoded otherwise; invalid UTF-8 becomes U+FFFD. A
/// token that is not a string reads as its raw bytes.
pub fn str_text(raw_token: &[u8]) -> Cow<'_, str> {
    let inner = str_value(raw_token).unwrap_or(raw_token);
    if !inner.contains(&b'\\') {
        return String::from_utf8_lossy(inner);
    }
    let fixed = String::from_utf8_lossy(raw_token);
    match serde_json::from_str::<String>(&fixed) {
        Ok(s) => Cow::Owned(s),
        Err(_) => Cow::Owned(String::from_utf8_lossy(inner).into_owned()),
    }
}

/// The parts of a JSON number (leading zeros tolerated): sign, integer
/// digits, fraction digits, exponent (saturated far beyond any i64 use).
pub(super) fn number_parts(text: &[u8]) -> Option<(bool, &[u8], &[u8], i64)> {
    let (neg, rest) = match text.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, text),
    };
    let digits = |s: &[u8]| s.iter().take_while(|b| b.is_ascii_digit()).count();
    let n = digits(rest);
    if n == 0 {
        return None;
    }
    let (int, mut rest) = rest.split_at(n);
    let mut frac: &[u8] = &[];
    if let Some((b'.', after)) = rest.split_first() {
        let n = digits(after);
        if n == 0 {
            return None;
        }
        (frac, rest) = after.split_at(n);
    }
    let mut exp = 0i64;
    if let Some((b'e' | b'E', after)) = rest.split_first() {
        let (neg_exp, after) = match after.split_first() {
            Some((b'-', a)) => (true, a),
            Some((b'+', a)) => (false, a),
            _ => (false, after),
        };
        let n = digits(after);
        if n == 0 {
            return None;
        }
        for &d in &after[..n] {
            exp = (exp * 10 + i64::from(d - b'0')).min(1 << 40);
        }
        if neg_exp {
            exp = -exp;
        }
        rest = &after[n..];
    }
    rest.is_empty().then_some((neg, int, frac, exp))
}

/// Timestamp text (a JSON number of µs, or a string holding one) to integer
/// nanoseconds without going through a float, rounding half away from zero
/// beyond three decimals. None if not a number or out of i64 range.
pub fn parse_us_to_ns(raw: &[u8]) -> Option<i64> {
    let text = str_value(raw).unwrap_or(raw);
    let (neg, int, frac, exp) = number_parts(text)?;
    let mut digits = int
        .iter()
        .chain(frac)
        .map(|d| d - b'0')
        .skip_while(|&d| d == 0);
    let significant = digits.clone().count() as i64;
    if significant == 0 {
        return Some(0);
    }
    // value = 0.d1d2...dn * 10^(n + exp - frac_len) µs, so the ns value has
    // `whole` digits before its decimal point.
    let whole = significant + exp - frac.len() as i64 + 3;
    if whole > 19 {
        return None;
    }
    let mut acc = 0u64;
    for _ in 0..whole.max(0) {
        acc = acc * 10 + u64::from(digits.next().unwrap_or(0));
    }
    // Half away from zero: only the first dropped digit matters.
    if whole >= 0 && digits.next().unwrap_or(0) >= 5 {
        acc += 1;
    }
    if neg {
        (acc <= 1 << 63).then(|| (acc as i64).wrapping_neg())
    } else {
        i64::try_from(acc).ok()
    }
}

/// Integer JSON value (pid/tid/id): a number, or a string of decimal digits or
/// `0x` hex; an integral float such as `12.0` too. Values above `i64::MAX`
/// (u64 ids) come back with their bits reinterpreted, which keeps them
/// distinct; None past 64 bits or if not an integer.
pub fn parse_int(raw: &[u8]) -> Option<i64> {
    let text = str_value(raw).unwrap_or(raw);
    if let Some(hex) = text
        .strip_prefix(b"0x")
        .or_else(|| text.strip_prefix(b"0X"))
    {
        if hex.is_empty() || hex.len() > 16 || !hex.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let s = std::str::from_utf8(hex).ok()?;
        return u64::from_str_radix(s, 16).ok().map(|v| v as i64);
    }
    let (neg, int, frac, exp) = number_parts(text)?;
    if exp != 0 || frac.iter().any(|&d| d != b'0') {
        return None;
    }
    let mut acc = 0u64;
    for &d in int {
        acc = acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if neg {
        (acc <= 1 << 63).then(|| (acc as i64).wrapping_neg())
    } else {
        Some(acc as i64)
    }
}
