#!/usr/bin/env python3
"""Regenerates the reader corpus next to this script (deterministic output).

Run once by hand: `python3 generate.py`. The expectation is in each name:
ok_* reads completely, salvage_* reads as a salvaged prefix, err_* is a
CoreError::Trace naming the file. See README.md for each file.
"""

import gzip
import json
import random
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent


def ev(i, ph="X", name=None, **extra):
    e = {"ph": ph, "name": name or f"op{i}", "pid": 1, "tid": 1, "ts": i * 10.0}
    if ph == "X":
        e["dur"] = 5.0
    e.update(extra)
    return json.dumps(e, separators=(",", ":"))


def events(n, start=0):
    return [ev(i) for i in range(start, start + n)]


INFO = json.dumps(
    {
        "ph": "M",
        "name": "fastprof_info",
        "pid": 4242,
        "tid": 0,
        "args": {
            "producer": "fastprof",
            "version": "0.1.0",
            "host": "node7",
            "pid": 4242,
            "rank": 1,
            "run_name": "corpus",
            "config": {"sample_hz": 10},
            "anchors": [[1700000000000000000, 1000]],
        },
    },
    separators=(",", ":"),
)
PNAME = '{"ph":"M","name":"process_name","pid":4242,"tid":0,"args":{"name":"rank 1"}}'
TNAME = '{"ph":"M","name":"thread_name","pid":4242,"tid":7,"args":{"name":"MainThread"}}'


def obj(evs, base=True, other=True):
    parts = []
    if base:
        parts.append('"baseTimeNanoseconds":1700000000000000000')
    parts.append('"traceEvents":[' + ",\n".join(evs) + "]")
    if other:
        parts.append('"otherData":{"version":"0.1.0","rank":1}')
    return ("{" + ",".join(parts) + "}\n").encode()


def segment_head(n):
    """An open fastprof segment: header, metadata events, n events, no close."""
    text = '{"baseTimeNanoseconds":1700000000000000000,"traceEvents":['
    return (text + ",\n".join([INFO, PNAME, TNAME] + events(n)) + ",\n").encode()


def gz_member(data):
    return gzip.compress(data, compresslevel=6, mtime=0)


def gz_sync_flushed(flushed, unflushed):
    """gzip stream with a sync flush after `flushed`, then `unflushed` compressed
    but cut before the next flush: what a killed writer leaves."""
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = c.compress(flushed) + c.flush(zlib.Z_SYNC_FLUSH)
    cut = len(out)
    rest = c.compress(unflushed) + c.flush(zlib.Z_FINISH)
    return out + rest[: len(rest) // 2], cut


FILES = {}

# --- complete documents -------------------------------------------------
FILES["ok_complete_object.json"] = obj(events(5))
FILES["ok_keys_reversed.json"] = (
    '{"otherData":{"a":1},"traceEvents":[' + ",".join(events(3)) + '],"baseTimeNanoseconds":5}'
).encode()
FILES["ok_array_closed.json"] = ("[" + ",\n".join(events(4)) + "]\n").encode()
FILES["ok_empty_trace_events.json"] = b'{"traceEvents":[]}'
FILES["ok_bom_prefixed.json"] = b"\xef\xbb\xbf" + obj(events(2))
FILES["ok_unbalanced_b_e.json"] = obj(
    [ev(0, "B", "open"), ev(1, "E", "close"), ev(2, "E", "orphan_end"), ev(3, "B", "never_closed")]
)
FILES["ok_huge_ints.json"] = obj(
    events(2)
    + [
        '{"ph":"i","name":"big","pid":18446744073709551617,"tid":-9223372036854775809,'
        '"ts":123456789012345678901234567890,"s":"t"}'
    ]
)
# One event with ts 1e400 (out of f64 range): dropped with a warning, the rest kept.
FILES["ok_absurd_1e400_ts.json"] = obj(
    events(2) + ['{"ph":"X","name":"inf","pid":1,"tid":1,"ts":1e400,"dur":-1e-400}'] + events(2, 2)
)
# args nested 1000 deep: past serde_json's recursion limit, dropped; 50 deep is fine.
FILES["ok_deeply_nested_args.json"] = obj(
    [
        ev(0),
        '{"ph":"i","name":"deep","pid":1,"tid":1,"ts":1,"args":' + "[" * 1000 + "1" + "]" * 1000 + "}",
        '{"ph":"i","name":"ok_deep","pid":1,"tid":1,"ts":2,"args":' + '{"a":' * 50 + "1" + "}" * 50 + "}",
        ev(3),
    ]
)
FILES["ok_invalid_utf8_names.json"] = obj(
    [ev(0)]
    + [
        ev(1, name="PLACEHOLDER1"),
        ev(2, name="PLACEHOLDER2"),
    ]
).replace(b"PLACEHOLDER1", b"at::\xff\xfeconv\xc3(").replace(b"PLACEHOLDER2", b"\xed\xa0\x80surrogate")
# Python json.dumps of a surrogateescape'd name: a lone surrogate escape serde_json refuses.
FILES["ok_lone_surrogate_escape.json"] = obj(events(1) + [ev(1, name="bad\udcff")] + events(1, 2))
FILES["ok_single_member.json.gz"] = gz_member(obj(events(10)))
whole = obj(events(8))
FILES["ok_multi_member.json.gz"] = gz_member(whole[:100]) + gz_member(whole[100:250]) + gz_member(whole[250:])
FILES["ok_nul_padded.json"] = obj(events(3)) + b"\x00" * 512
FILES["ok_trailing_comma.json"] = ('{"traceEvents":[' + ",".join(events(3)) + ",]}").encode()
# Raw control bytes inside strings (a writer that forgot to escape): each
# such event is dropped, the walk resumes at the next one.
FILES["ok_raw_control_chars_in_strings.json"] = obj(
    [ev(i, name=f"op{i}" + {1: "\t", 3: "\x00", 5: "\n"}.get(i, "")) for i in range(7)]
).replace(b"\\t", b"\t").replace(b"\\u0000", b"\x00").replace(b"\\n", b"\n")
# Garbage between events, as a buggy writer or a bad concatenation leaves.
FILES["ok_garbage_between_events.json"] = (
    '{"traceEvents":[' + ev(0) + ", @@ junk @@ ," + ev(1) + " xx " + ev(2) + ",\x07," + ev(3) + "]}"
).encode()
# Events every JSON parser refuses but whose brackets balance, as a merge
# copying bytes through would have passed them on: trailing commas, a missing
# comma or colon, misspelt literals, numbers JSON does not allow, bare keys.
MALFORMED = [
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1.0,"dur":1.0,}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1.0,"dur":1.0,"args":{"x":1,}}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1.0,"dur":1.0,"args":{"x":[1,2,]}}',
    '{"ph":"X","name":"a" "pid":1,"tid":1,"ts":1.0,"dur":1.0}',
    '{"ph":"X","name" "a","pid":1,"tid":1,"ts":1.0,"dur":1.0}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1.0,"dur":1.0,"args":{"b":tru}}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":+5,"dur":1.0}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":.5,"dur":1.0}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":05,"dur":1.0}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":5.,"dur":1.0}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,,"dur":1}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1,"args":{"k":nul}}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1,"args":[1 2]}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1,"args":{"a":-}}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1,"args":{"a":1e}}',
    '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1,"args":{"a":1}}}',
]
FILES["ok_malformed_events.json"] = obj([e for i, m in enumerate(MALFORMED) for e in (ev(i), m)] + [ev(99)])
FILES["ok_kineto_like.json"] = json.dumps(
    {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
        "baseTimeNanoseconds": 1700000000000000000,
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 10, "ts": 1.5, "dur": 2.25,
             "args": {"External id": 1, "Input Dims": [[4, 4], [4, 4]]}},
            {"ph": "s", "id": 1, "pid": 10, "tid": 10, "ts": 1.6, "cat": "ac2g", "name": "ac2g"},
            {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 5.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
            {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 9.0},
        ],
        "traceName": "rank0.pt.trace.json",
    },
    indent=2,
).encode()

# --- salvageable prefixes -------------------------------------------------
FILES["salvage_array_no_bracket.json"] = ("[" + ",\n".join(events(4)) + ",\n").encode()
FILES["salvage_array_partial_event.json"] = ("[" + ",\n".join(events(4)) + ',\n{"ph":"X","na').encode()
FILES["salvage_mid_event.json"] = obj(events(6))[:-60]
FILES["salvage_fastprof_open_segment.json"] = segment_head(5) + b'{"ph":"C","name":"cpu","pid":4242,"ts":9'
data, _flush_point = gz_sync_flushed(segment_head(20), ",\n".join(events(40, 20)).encode())
FILES["salvage_truncated_gzip_sync_flush.json.gz"] = data
FILES["salvage_multi_member_truncated.json.gz"] = gz_member(segment_head(3)) + (
    gz_member(",\n".join(events(30, 3)).encode())[:-40]
)
FILES["salvage_nul_padding_mid_list.json"] = ('{"traceEvents":[' + ",".join(events(3)) + ",").encode() + b"\x00" * 256
FILES["salvage_truncated_in_other_data.json"] = obj(events(3))[:-12]
FILES["salvage_opened_no_events.json"] = b'{"baseTimeNanoseconds":1,"traceEvents":[\n{"ph":"M","name":"fastprof_in'

# --- not traces ---------------------------------------------------------------
rng = random.Random(1234)
FILES["err_empty.json"] = b""
FILES["err_whitespace_only.json"] = b" \n\t\r\n  "
FILES["err_garbage.bin"] = bytes([0x42]) + bytes(rng.randrange(256) for _ in range(2047))
FILES["err_nul_bytes.bin"] = b"\x00" * 1024
FILES["err_html.bin"] = b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n"
FILES["err_not_trace_object.json"] = b'{"foo":1}'
FILES["err_number.json"] = b"42\n"
FILES["err_string.json"] = b'"traceEvents"'
FILES["err_trace_events_not_array.json"] = b'{"traceEvents":{"ph":"X"}}'
FILES["err_array_of_numbers.json"] = b"[1, 2, 3]"
FILES["err_truncated_before_trace_events.json"] = b'{"baseTimeNanoseconds":1700000000000000000,"otherData":{"ra'
FILES["err_gzip_garbage.json.gz"] = b"\x1f\x8b\x08\x00" + bytes(rng.randrange(256) for _ in range(512))
FILES["err_gzip_empty_member.json.gz"] = gz_member(b"")
FILES["err_truncated_gzip_header.json.gz"] = gz_member(obj(events(3)))[:6]
FILES["err_python_pickle.bin"] = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x03key\x94K\x01s."


def main():
    for name, data in sorted(FILES.items()):
        assert len(data) < 20_000, name
        (HERE / name).write_bytes(data)
        print(f"{len(data):6d}  {name}")


if __name__ == "__main__":
    main()
