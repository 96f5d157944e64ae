//! Finding merge inputs: files, directories (searched for fastprof segments,
//! `*.pt.trace.json[.gz]` and other Chrome traces) and glob patterns.

use crate::error::{CoreError, Result};
use std::path::{Path, PathBuf};

/// Whether a file name looks like a trace we merge.
pub fn is_trace_name(name: &str) -> bool {
    name.ends_with(".json")
        || name.ends_with(".json.gz")
        || (name.starts_with("fastprof.") && name.ends_with(".json.gz.part"))
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| CoreError::io(dir, e))?
        .filter_map(|e| e.ok())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else if is_trace_name(&e.file_name().to_string_lossy()) {
            out.push(p);
        }
    }
    Ok(())
}

/// `*` and `?` in one path component.
fn wildcard(pat: &[u8], s: &[u8]) -> bool {
    match (pat.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => wildcard(&pat[1..], s) || (!s.is_empty() && wildcard(pat, &s[1..])),
        (Some(b'?'), Some(_)) => wildcard(&pat[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => wildcard(&pat[1..], &s[1..]),
        _ => false,
    }
}

fn glob(pattern: &str) -> Result<Vec<PathBuf>> {
    let mut current = vec![if pattern.starts_with('/') {
        PathBuf::from("/")
    } else {
        PathBuf::from(".")
    }];
    for comp in pattern.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        for base in &current {
            if comp.contains(['*', '?']) {
                let Ok(rd) = std::fs::read_dir(base) else {
                    continue;
                };
                let mut names: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
                names.sort();
                for n in names {
                    if wildcard(comp.as_bytes(), n.to_string_lossy().as_bytes()) {
                        next.push(base.join(n));
                    }
                }
            } else {
                let p = base.join(comp);
                if p.exists() {
                    next.push(p);
                }
            }
        }
        current = next;
    }
    Ok(current
        .into_iter()
        .map(|p| p.strip_prefix("./").map(Path::to_path_buf).unwrap_or(p))
        .collect())
}

/// Expand the command-line inputs into trace files, in a stable order,
/// without duplicates. A missing input is an error naming it.
pub fn expand(args: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for a in args {
        let s = a.to_string_lossy();
        if a.is_dir() {
            walk(a, &mut out)?;
        } else if a.is_file() {
            out.push(a.clone());
        } else if s.contains(['*', '?']) {
            let found = glob(&s)?;
            if found.is_empty() {
                return Err(CoreError::io(
                    a,
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no file matches this pattern",
                    ),
                ));
            }
            for p in found {
                if p.is_dir() {
                    walk(&p, &mut out)?;
                } else {
                    out.push(p);
                }
            }
        } else {
            return Err(CoreError::io(
                a,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
            ));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| seen.insert(p.canonicalize().unwrap_or_else(|_| p.clone())));
    Ok(out)
}

/// Rank from a path: a `rank{R}` / `rank_{R}` / `rank-{R}` component or file-name part.
pub fn rank_from_path(p: &Path) -> Option<u32> {
    for comp in p.components().rev() {
        let s = comp.as_os_str().to_string_lossy().to_lowercase();
        let mut rest = s.as_str();
        while let Some(i) = rest.find("rank") {
            let tail = rest[i + 4..].trim_start_matches(['_', '-']);
            let digits: String = tail.chars().take_while(|c| c.is_ascii_digit()).collect();
            if !digits.is_empty() {
                return digits.parse().ok();
            }
            rest = &rest[i + 4..];
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_and_ranks() {
        assert!(wildcard(b"*.json.gz", b"a.pt.trace.json.gz"));
        assert!(wildcard(b"fastprof.?.json.gz", b"fastprof.3.json.gz"));
        assert!(!wildcard(b"*.json", b"a.json.gz"));
        assert_eq!(
            rank_from_path(Path::new("runs/x/rank3/fastprof.0.json.gz")),
            Some(3)
        );
        assert_eq!(
            rank_from_path(Path::new("runs/trace_rank_12.json")),
            Some(12)
        );
        assert_eq!(
            rank_from_path(Path::new("runs/host_123.pt.trace.json")),
            None
        );
    }
}
