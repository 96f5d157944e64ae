//! The byte walk over one JSON value: the byte-class tables, bracket matching over a bit
//! stack, strings and their escapes, and the checks copy-through needs (control characters,
//! stray bytes between tokens, malformed scalars).

use super::{number_parts, STACK_WORDS};

pub(super) fn starts_value(b: u8) -> bool {
    matches!(
        b,
        b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'
    )
}

pub(super) fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')
}

/// `true`, `false`, `null` or a JSON number.
pub(super) fn valid_scalar(tok: &[u8]) -> bool {
    matches!(tok, b"true" | b"false" | b"null") || number_parts(tok).is_some()
}

/// Byte classes outside strings.
pub(super) const PLAIN: u8 = 0;
pub(super) const QUOTE: u8 = 1;
pub(super) const OPEN: u8 = 2;
pub(super) const CLOSE: u8 = 3;
pub(super) const STRAY: u8 = 4;

/// Outside strings only blanks, `:`, `,`, number and literal characters are
/// plain; anything else would not survive copy-through as JSON.
pub(super) static OUTSIDE: [u8; 256] = {
    let mut t = [STRAY; 256];
    let plain = b" \t\r\n:,+-.0123456789eEtruefalsn";
    let mut i = 0;
    while i < plain.len() {
        t[plain[i] as usize] = PLAIN;
        i += 1;
    }
    t[b'"' as usize] = QUOTE;
    t[b'{' as usize] = OPEN;
    t[b'[' as usize] = OPEN;
    t[b'}' as usize] = CLOSE;
    t[b']' as usize] = CLOSE;
    t
};

/// Inside strings: 0 for bytes copied as they are, 1 for `"`, `\` and control bytes.
pub(super) static INSIDE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = 1;
        i += 1;
    }
    t[b'"' as usize] = 1;
    t[b'\\' as usize] = 1;
    t
};

/// Resumable state of the walk over one string, object or array.
#[derive(Default)]
pub(super) struct Walk {
    /// Next byte to look at, relative to the value's first (kept) byte.
    pub(super) off: usize,
    depth: usize,
    in_str: bool,
    /// The first reason the value cannot be copied through, with its offset.
    pub(super) bad: Option<(u64, &'static str)>,
}

impl Walk {
    pub(super) fn note(&mut self, at: u64, why: &'static str) {
        if self.bad.is_none() {
            self.bad = Some((at, why));
        }
    }
}

/// Advance `w` over `buf`; true when the value ended (`w.off` is then just
/// past it). `abs0` is the text offset of `buf[0]`, for messages. The hot
/// loop of the module: two table-driven byte loops, no calls.
pub(super) fn walk(buf: &[u8], w: &mut Walk, stack: &mut [u64; STACK_WORDS], abs0: u64) -> bool {
    let n = buf.len();
    let mut i = w.off;
    let mut depth = w.depth;
    let done = 'scan: loop {
        if w.in_str {
            loop {
                while i < n && INSIDE[buf[i] as usize] == 0 {
                    i += 1;
                }
                if i >= n {
                    break 'scan false;
                }
                match buf[i] {
                    b'"' => {
                        i += 1;
                        w.in_str = false;
                        if depth == 0 {
                            break 'scan true;
                        }
                        break;
                    }
                    b'\\' => {
                        let need = if buf.get(i + 1) == Some(&b'u') { 6 } else { 2 };
                        if i + need > n {
                            // Look at the escape again once the rest is in.
                            break 'scan false;
                        }
                        let ok = match buf[i + 1] {
                            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => true,
                            b'u' => buf[i + 2..i + 6].iter().all(u8::is_ascii_hexdigit),
                            _ => false,
                        };
                        if !ok {
                            w.note(abs0 + i as u64, "invalid escape in a string");
                        }
                        i += 2;
                    }
                    _ => {
                        w.note(abs0 + i as u64, "control character in a string");
                        i += 1;
                    }
                }
            }
        }
        while i < n {
            let b = buf[i];
            i += 1;
            match OUTSIDE[b as usize] {
                PLAIN => {}
                QUOTE => {
                    w.in_str = true;
                    continue 'scan;
                }
                OPEN => {
                    if depth < STACK_WORDS * 64 {
                        let bit = 1u64 << (depth % 64);
                        if b == b'[' {
                            stack[depth / 64] |= bit;
                        } else {
                            stack[depth / 64] &= !bit;
                        }
                    }
                    depth += 1;
                }
                CLOSE => {
                    if depth == 0 {
                        // Unreachable from a value's first byte; stop safely.
                        w.note(abs0 + i as u64 - 1, "unbalanced bracket");
                        break 'scan true;
                    }
                    depth -= 1;
                    if depth < STACK_WORDS * 64 {
                        let is_array = stack[depth / 64] >> (depth % 64) & 1 == 1;
                        if is_array != (b == b']') {
                            w.note(abs0 + i as u64 - 1, "mismatched bracket");
                        }
                    }
                    if depth == 0 {
                        break 'scan true;
                    }
                }
                _ => w.note(abs0 + i as u64 - 1, "unexpected byte outside a string"),
            }
        }
        break false;
    };
    w.off = i;
    w.depth = depth;
    done
}
