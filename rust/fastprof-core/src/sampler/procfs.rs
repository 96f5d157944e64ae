//! Host, process and child-process readings from /proc, with the files kept
//! open and re-read from offset 0 each tick (no directory walk, no `sysinfo`
//! full refresh). Rates are computed from deltas over the measured interval.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A /proc file kept open; `read` re-reads it whole into a reused buffer
/// (zeroed once, grown only when a file outgrows it).
pub struct ProcFile {
    file: File,
    buf: Vec<u8>,
}

impl ProcFile {
    pub fn open(path: impl AsRef<Path>) -> Option<ProcFile> {
        File::open(path).ok().map(|file| ProcFile {
            file,
            buf: vec![0; 4096],
        })
    }

    /// The file's current contents (procfs regenerates them on each read from 0).
    pub fn read(&mut self) -> Option<&str> {
        let mut used = 0;
        loop {
            if self.buf.len() - used < 512 {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            let n = self.file.read_at(&mut self.buf[used..], used as u64).ok()?;
            if n == 0 {
                break;
            }
            used += n;
        }
        std::str::from_utf8(&self.buf[..used]).ok()
    }
}

fn nums(line: &str) -> impl Iterator<Item = u64> + '_ {
    line.split_ascii_whitespace().filter_map(|x| x.parse().ok())
}

/// CPU jiffies: (busy, total) for `cpu` and each `cpuN` line of /proc/stat.
pub fn parse_stat(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .take_while(|l| l.starts_with("cpu"))
        .map(|l| {
            let v: Vec<u64> = nums(l).collect();
            // user nice system idle iowait irq softirq steal (guest fields are inside user)
            let total: u64 = v.iter().take(8).sum();
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            (total.saturating_sub(idle), total)
        })
        .collect()
}

/// Values in kB of the named /proc/meminfo fields, as bytes.
pub fn parse_meminfo(text: &str, keys: &[&str]) -> Vec<u64> {
    let mut out = vec![0; keys.len()];
    for l in text.lines() {
        if let Some((k, rest)) = l.split_once(':') {
            if let Some(i) = keys.iter().position(|x| *x == k) {
                out[i] = nums(rest).next().unwrap_or(0) * 1024;
            }
        }
    }
    out
}

/// (rx, tx) bytes summed over every interface but loopback.
pub fn parse_netdev(text: &str) -> (u64, u64) {
    let (mut rx, mut tx) = (0, 0);
    for l in text.lines().skip(2) {
        if let Some((name, rest)) = l.split_once(':') {
            if name.trim() == "lo" {
                continue;
            }
            let v: Vec<u64> = nums(rest).collect();
            rx += v.first().copied().unwrap_or(0);
            tx += v.get(8).copied().unwrap_or(0);
        }
    }
    (rx, tx)
}

/// Fields of /proc/<pid>/stat after the `(comm)`: (num_threads, rss pages, utime+stime jiffies).
pub fn parse_pid_stat(text: &str) -> Option<(u64, u64, u64)> {
    let after = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_ascii_whitespace().collect();
    // after ")": state(0) ppid(1) ... utime(11) stime(12) ... num_threads(17) ... rss(21)
    let g = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok());
    Some((g(17)?, g(21)?, g(11)? + g(12)?))
}

/// (bytes read, bytes written) from a `/sys/block/<disk>/stat` line
/// (fields 3 and 7 are sectors of 512 bytes, whatever the device's own size).
pub fn parse_block_stat(text: &str) -> (u64, u64) {
    let v: Vec<u64> = nums(text).collect();
    (
        v.get(2).copied().unwrap_or(0) * 512,
        v.get(6).copied().unwrap_or(0) * 512,
    )
}

/// (1-minute load, swap used bytes) through sysinfo(2): one cheap syscall
/// instead of a /proc file, which costs ~3x more once caches are cold.
pub fn sysinfo_load_swap() -> Option<(f64, u64)> {
    // SAFETY: zeroed sysinfo is valid; the call only writes into it.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    if unsafe { libc::sysinfo(&mut si) } != 0 {
        return None;
    }
    let unit = si.mem_unit.max(1) as u64;
    let load = si.loads[0] as f64 / 65536.0;
    Some((
        load,
        (si.totalswap as u64).saturating_sub(si.freeswap as u64) * unit,
    ))
}

/// Whole disks worth summing: those in /sys/block that are not virtual
/// stand-ins (loop, ram, zram) or stacked on other disks (dm, md), which
/// would count the same bytes twice.
pub fn whole_disks() -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/sys/block") {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if !["loop", "ram", "zram", "dm-", "md", "sr", "fd"]
                .iter()
                .any(|p| n.starts_with(p))
            {
                out.push(n);
            }
        }
    }
    out.sort();
    out
}

/// A child (or deeper descendant) process being followed.
struct Child {
    stat: ProcFile,
    schedstat: Option<ProcFile>,
    last_cpu_ns: Option<u64>,
}

/// Follows this process's descendants: refreshed every `refresh` ticks,
/// CPU from schedstat (ns precision) where present, else stat jiffies.
pub struct Children {
    own_pid: u32,
    kids: HashMap<u32, Child>,
    page: u64,
    jiffy_ns: u64,
}

impl Children {
    pub fn new(own_pid: u32, page: u64, jiffy_ns: u64) -> Children {
        Children {
            own_pid,
            kids: HashMap::new(),
            page,
            jiffy_ns,
        }
    }

    /// Re-discover descendants through /proc/<pid>/task/*/children.
    pub fn refresh(&mut self) {
        let mut found = Vec::new();
        let mut stack = vec![self.own_pid];
        while let Some(p) = stack.pop() {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
                continue;
            };
            for t in tasks.flatten() {
                let mut path: PathBuf = t.path();
                path.push("children");
                if let Ok(s) = std::fs::read_to_string(&path) {
                    for c in s
                        .split_ascii_whitespace()
                        .filter_map(|x| x.parse::<u32>().ok())
                    {
                        if !found.contains(&c) {
                            found.push(c);
                            stack.push(c);
                        }
                    }
                }
            }
        }
        self.kids.retain(|pid, _| found.contains(pid));
        for pid in found {
            if let std::collections::hash_map::Entry::Vacant(v) = self.kids.entry(pid) {
                if let Some(stat) = ProcFile::open(format!("/proc/{pid}/stat")) {
                    v.insert(Child {
                        stat,
                        schedstat: ProcFile::open(format!("/proc/{pid}/schedstat")),
                        last_cpu_ns: None,
                    });
                }
            }
        }
    }

    /// (count, summed CPU % of one core over `dt_ns`, summed RSS bytes).
    pub fn sample(&mut self, dt_ns: u64) -> (usize, f64, u64) {
        let (mut cpu_ns, mut rss) = (0u64, 0u64);
        let page = self.page;
        let jiffy = self.jiffy_ns;
        self.kids.retain(|_, c| {
            let Some((_, rss_pages, jiffies)) = c.stat.read().and_then(parse_pid_stat) else {
                return false; // exited
            };
            rss += rss_pages * page;
            let now = c
                .schedstat
                .as_mut()
                .and_then(|f| f.read().and_then(|t| nums(t).next()))
                .unwrap_or(jiffies * jiffy);
            if let Some(last) = c.last_cpu_ns {
                cpu_ns += now.saturating_sub(last);
            }
            c.last_cpu_ns = Some(now);
            true
        });
        let pct = if dt_ns > 0 {
            cpu_ns as f64 * 100.0 / dt_ns as f64
        } else {
            0.0
        };
        (self.kids.len(), pct, rss)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_formats() {
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\nintr 1\n";
        assert_eq!(parse_stat(stat), vec![(150, 1000), (75, 500)]);
        let mem = "MemTotal: 1000 kB\nMemAvailable: 400 kB\nSwapTotal: 0 kB\n";
        assert_eq!(
            parse_meminfo(mem, &["MemTotal", "MemAvailable"]),
            vec![1_024_000, 409_600]
        );
        let net = "h1\nh2\n    lo: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n  eth0: 100 1 0 0 0 0 0 0 200 1 0 0 0 0 0 0\n";
        assert_eq!(parse_netdev(net), (100, 200));
        let pstat = "42 (py thon) S 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 5 0 1 100 250";
        assert_eq!(parse_pid_stat(pstat), Some((5, 250, 10)));
    }

    #[test]
    fn reads_own_proc_files_again_and_again() {
        let mut f = ProcFile::open("/proc/self/stat").unwrap();
        let a = f.read().unwrap().to_string();
        let b = f.read().unwrap().to_string();
        assert!(parse_pid_stat(&a).is_some() && parse_pid_stat(&b).is_some());
    }
}
