//! Host, process and child-process readings from /proc and /sys, with the
//! files kept open and re-read from offset 0 each tick (no directory walk per
//! tick, no `sysinfo` full refresh), parsed in place without allocating.
//! Rates are computed by the sampler from deltas over the measured interval.
//!
//! Every read is a syscall whose kernel path goes cold between ticks (on the
//! 2-vCPU VM we measured, 1–10 µs back to back but 10–30 µs 10 ms apart), so
//! the sampler reads as few files as the metrics allow and takes what it can
//! from single syscalls: sysinfo(2) for the load, getrusage(2) for this
//! process's CPU, context switches and I/O, fstat(2) of /proc/self/task for
//! its thread count, /proc/self/statm (not the far costlier /proc/self/stat)
//! for its RSS.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A /proc or /sys file kept open; `read` re-reads it whole into a reused
/// buffer (grown only when a file outgrows it).
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

    /// The file's current contents (procfs and sysfs regenerate them on each
    /// read from offset 0). `None` once the file is gone (its process exited).
    pub fn read(&mut self) -> Option<&[u8]> {
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
        Some(&self.buf[..used])
    }
}

/// Unsigned decimal numbers of `text`, in order (any other byte separates).
pub struct Nums<'a> {
    text: &'a [u8],
    at: usize,
}

impl Iterator for Nums<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let t = self.text;
        while self.at < t.len() && !t[self.at].is_ascii_digit() {
            self.at += 1;
        }
        if self.at == t.len() {
            return None;
        }
        let mut v: u64 = 0;
        while self.at < t.len() && t[self.at].is_ascii_digit() {
            v = v.wrapping_mul(10).wrapping_add((t[self.at] - b'0') as u64);
            self.at += 1;
        }
        Some(v)
    }
}

pub fn nums(text: &[u8]) -> Nums<'_> {
    Nums { text, at: 0 }
}

/// The lines of `text` (without their newline).
fn lines(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    text.split(|&b| b == b'\n').filter(|l| !l.is_empty())
}

/// One line of /proc/stat: busy and total jiffies of all cores (`core:
/// None`, the `cpu` line) or of core `N` (a `cpuN` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    pub core: Option<u32>,
    pub busy: u64,
    pub total: u64,
}

/// CPU jiffies from /proc/stat into `out`: the `cpu` line, then, with
/// `per_cpu`, each `cpuN` line (cores are numbered by their label: an
/// offline core has no line, so position and number can differ).
pub fn parse_stat(text: &[u8], per_cpu: bool, out: &mut Vec<CpuTimes>) {
    out.clear();
    for l in lines(text) {
        if !l.starts_with(b"cpu") || (!per_cpu && !out.is_empty()) {
            break;
        }
        // Skip the label ("cpu" or "cpuN") so its digits are not read.
        let label_end = l.iter().position(|&b| b == b' ').unwrap_or(l.len());
        let core = nums(&l[3..label_end]).next().map(|n| n as u32);
        // user nice system idle iowait irq softirq steal (guest time is inside user)
        let (mut total, mut idle) = (0u64, 0u64);
        for (i, v) in nums(&l[label_end..]).take(8).enumerate() {
            total += v;
            if i == 3 || i == 4 {
                idle += v;
            }
        }
        out.push(CpuTimes {
            core,
            busy: total.saturating_sub(idle),
            total,
        });
    }
}

/// Memory of /proc/meminfo, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Meminfo {
    pub total: u64,
    pub available: u64,
    pub swap_total: u64,
    pub swap_free: u64,
}

/// The fields of [`Meminfo`] (stops reading once it has them all); `None`
/// when `MemTotal` or `MemAvailable` is missing.
pub fn parse_meminfo(text: &[u8]) -> Option<Meminfo> {
    let mut m = Meminfo::default();
    let mut seen = 0u8;
    for l in lines(text) {
        let (slot, bit) = if l.starts_with(b"MemTotal:") {
            (&mut m.total, 1)
        } else if l.starts_with(b"MemAvailable:") {
            (&mut m.available, 2)
        } else if l.starts_with(b"SwapTotal:") {
            (&mut m.swap_total, 4)
        } else if l.starts_with(b"SwapFree:") {
            (&mut m.swap_free, 8)
        } else {
            continue;
        };
        *slot = nums(l).next().unwrap_or(0) * 1024;
        seen |= bit;
        if seen == 15 {
            break;
        }
    }
    (seen & 3 == 3).then_some(m)
}

/// (rx, tx) bytes summed over the named interfaces of /proc/net/dev.
pub fn parse_netdev(text: &[u8], ifaces: &[String]) -> (u64, u64) {
    let (mut rx, mut tx) = (0, 0);
    for l in lines(text).skip(2) {
        let Some(colon) = l.iter().position(|&b| b == b':') else {
            continue;
        };
        let name = l[..colon].trim_ascii();
        if !ifaces.iter().any(|i| i.as_bytes() == name) {
            continue;
        }
        let mut v = nums(&l[colon + 1..]);
        rx += v.next().unwrap_or(0);
        tx += v.nth(7).unwrap_or(0);
    }
    (rx, tx)
}

/// Resident pages: the second field of /proc/<pid>/statm.
pub fn parse_statm_rss(text: &[u8]) -> Option<u64> {
    nums(text).nth(1)
}

/// (rss pages, utime+stime jiffies) from /proc/<pid>/stat (fields after `(comm)`).
pub fn parse_pid_stat(text: &[u8]) -> Option<(u64, u64)> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let after = text.get(close + 2..)?;
    // after ")": state(0) ppid(1) ... utime(11) stime(12) ... rss(21); state is a letter
    let mut f = after.split(|&b| b == b' ').skip(1);
    let num = |x: Option<&[u8]>| -> Option<u64> {
        let x = x?;
        (!x.is_empty() && x.iter().all(u8::is_ascii_digit)).then(|| nums(x).next())?
    };
    let utime = num(f.nth(10))?;
    let stime = num(f.next())?;
    let rss = num(f.nth(8))?;
    Some((rss, utime + stime))
}

/// (bytes read, bytes written) from a `/sys/block/<disk>/stat` line
/// (fields 3 and 7 are sectors of 512 bytes, whatever the device's own size).
pub fn parse_block_stat(text: &[u8]) -> (u64, u64) {
    let mut v = nums(text);
    let read = v.nth(2).unwrap_or(0);
    let written = v.nth(3).unwrap_or(0);
    (read * 512, written * 512)
}

/// The 1-minute load average through sysinfo(2): one syscall, cheaper than
/// reading /proc/loadavg once caches are cold.
pub fn load1() -> Option<f64> {
    // SAFETY: zeroed sysinfo is valid; the call only writes into it.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    if unsafe { libc::sysinfo(&mut si) } != 0 {
        return None;
    }
    Some(si.loads[0] as f64 / 65536.0)
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

/// Network interfaces worth summing: those backed by a device (a NIC, real
/// or virtual), so that traffic is not counted again on the bridges, veths,
/// ifb and tunnels stacked on them. Where no interface has a device (inside
/// a container's network namespace), every interface but loopback.
pub fn net_interfaces() -> Vec<String> {
    let mut with_device = Vec::new();
    let mut all = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/sys/class/net") {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n == "lo" {
                continue;
            }
            if e.path().join("device").exists() {
                with_device.push(n.clone());
            }
            all.push(n);
        }
    }
    let mut out = if with_device.is_empty() {
        all
    } else {
        with_device
    };
    out.sort();
    out
}

/// Network byte counters of chosen interfaces: two small sysfs files per
/// interface when there are few (each read formats one number), else one
/// read of /proc/net/dev (which formats 16 numbers for every interface).
pub enum NetSource {
    Sysfs(Vec<(ProcFile, ProcFile)>),
    ProcNetDev(ProcFile, Vec<String>),
}

impl NetSource {
    /// Up to this many interfaces, per-interface sysfs files are cheaper.
    const SYSFS_MAX: usize = 2;

    pub fn open(ifaces: &[String]) -> Option<NetSource> {
        if ifaces.len() <= Self::SYSFS_MAX {
            let files: Option<Vec<_>> = ifaces
                .iter()
                .map(|i| {
                    let dir = format!("/sys/class/net/{i}/statistics");
                    Some((
                        ProcFile::open(format!("{dir}/rx_bytes"))?,
                        ProcFile::open(format!("{dir}/tx_bytes"))?,
                    ))
                })
                .collect();
            if let Some(f) = files {
                return Some(NetSource::Sysfs(f));
            }
        }
        ProcFile::open("/proc/net/dev").map(|f| NetSource::ProcNetDev(f, ifaces.to_vec()))
    }

    /// Summed (rx, tx) bytes; `None` when an interface vanished (the caller
    /// skips that tick's rate rather than report a bogus jump).
    pub fn read(&mut self) -> Option<(u64, u64)> {
        match self {
            NetSource::Sysfs(files) => {
                let (mut rx, mut tx) = (0, 0);
                for (r, t) in files.iter_mut() {
                    rx += nums(r.read()?).next()?;
                    tx += nums(t.read()?).next()?;
                }
                Some((rx, tx))
            }
            NetSource::ProcNetDev(f, ifaces) => f.read().map(|t| parse_netdev(t, ifaces)),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            NetSource::Sysfs(_) => "sysfs",
            NetSource::ProcNetDev(..) => "/proc/net/dev",
        }
    }
}

/// Threads of a process, from the link count of its open /proc/<pid>/task
/// directory (procfs adds one per thread to the directory's two): one fstat
/// instead of reading /proc/<pid>/stat or listing the directory.
pub struct TaskDir {
    dir: File,
    path: String,
}

impl TaskDir {
    pub fn open(pid: u32) -> Option<TaskDir> {
        let path = format!("/proc/{pid}/task");
        let dir = File::open(&path).ok()?;
        let t = TaskDir { dir, path };
        // Some procfs (old kernels, other OSes) do not count threads in nlink.
        (t.threads()? >= 1).then_some(t)
    }

    pub fn threads(&self) -> Option<u64> {
        // fstat(2) itself: std's metadata() goes through statx with an empty
        // path, which costs a path lookup more.
        // SAFETY: zeroed stat is valid; fstat only writes into it; the fd is open.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(self.dir.as_raw_fd(), &mut st) } != 0 {
            return None;
        }
        Some((st.st_nlink as u64).saturating_sub(2))
    }

    /// Thread ids, listed afresh.
    fn tids(&self) -> Vec<u32> {
        std::fs::read_dir(&self.path)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The children files of one process's threads, kept open; the thread list
/// is re-read only when the thread count changes.
struct TaskWatch {
    task: TaskDir,
    threads_seen: u64,
    calls: u32,
    children: Vec<(u32, ProcFile)>,
}

impl TaskWatch {
    fn open(pid: u32) -> Option<TaskWatch> {
        Some(TaskWatch {
            task: TaskDir::open(pid)?,
            threads_seen: 0,
            calls: 0,
            children: Vec::new(),
        })
    }

    /// Append the pids of this process's children to `out`.
    fn children_into(&mut self, out: &mut Vec<u32>) {
        let n = self.task.threads().unwrap_or(0);
        self.calls = self.calls.wrapping_add(1);
        // Also now and then: one thread may have exited and another started.
        if n != self.threads_seen || self.calls % 16 == 1 {
            self.threads_seen = n;
            let tids = self.task.tids();
            self.children.retain(|(t, _)| tids.contains(t));
            for t in tids {
                if !self.children.iter().any(|(x, _)| *x == t) {
                    if let Some(f) = ProcFile::open(format!("{}/{t}/children", self.task.path)) {
                        self.children.push((t, f));
                    }
                }
            }
        }
        for (_, f) in self.children.iter_mut() {
            if let Some(text) = f.read() {
                out.extend(nums(text).map(|p| p as u32));
            }
        }
    }
}

/// A child (or deeper descendant) process being followed.
struct Child {
    stat: ProcFile,
    schedstat: Option<ProcFile>,
    watch: Option<TaskWatch>,
    last_cpu_ns: Option<u64>,
}

/// Follows this process's descendants: re-discovered every `refresh` ticks
/// through the children files of every thread (kept open), CPU from
/// schedstat (ns precision) where present, else stat jiffies.
pub struct Children {
    own: Option<TaskWatch>,
    kids: HashMap<u32, Child>,
    page: u64,
    jiffy_ns: u64,
    found: Vec<u32>,
}

impl Children {
    pub fn new(own_pid: u32, page: u64, jiffy_ns: u64) -> Children {
        Children {
            own: TaskWatch::open(own_pid),
            kids: HashMap::new(),
            page,
            jiffy_ns,
            found: Vec::new(),
        }
    }

    /// This process's thread count (one fstat of its task directory).
    pub fn own_threads(&self) -> Option<u64> {
        self.own.as_ref().and_then(|w| w.task.threads())
    }

    /// Re-discover descendants: this process's children, theirs, and so on.
    pub fn refresh(&mut self) {
        let mut found = std::mem::take(&mut self.found);
        found.clear();
        if let Some(w) = self.own.as_mut() {
            w.children_into(&mut found);
        }
        // Breadth-first through the known descendants (and newly found ones).
        let mut i = 0;
        while i < found.len() {
            let pid = found[i];
            i += 1;
            let kid = match self.kids.entry(pid) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => {
                    // Gone between discovery and open: nothing to follow.
                    let Some(stat) = ProcFile::open(format!("/proc/{pid}/stat")) else {
                        continue;
                    };
                    v.insert(Child {
                        stat,
                        schedstat: ProcFile::open(format!("/proc/{pid}/schedstat")),
                        watch: TaskWatch::open(pid),
                        last_cpu_ns: None,
                    })
                }
            };
            let before = found.len();
            if let Some(w) = kid.watch.as_mut() {
                w.children_into(&mut found);
            }
            // A pid seen twice (a race with reparenting) is followed once.
            let mut j = before;
            while j < found.len() {
                if found[..j].contains(&found[j]) {
                    found.swap_remove(j);
                } else {
                    j += 1;
                }
            }
        }
        self.kids.retain(|pid, _| found.contains(pid));
        self.found = found;
    }

    /// (count, summed CPU % of one core over `dt_ns`, summed RSS bytes).
    pub fn sample(&mut self, dt_ns: u64) -> (usize, f64, u64) {
        let (mut cpu_ns, mut rss) = (0u64, 0u64);
        let page = self.page;
        let jiffy = self.jiffy_ns;
        self.kids.retain(|_, c| {
            let Some((rss_pages, jiffies)) = c.stat.read().and_then(parse_pid_stat) else {
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
        let stat = b"cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\ncpu1 50 0 25 400 25 0 0 0 0 0\nintr 1\n";
        let mut out = Vec::new();
        parse_stat(stat, true, &mut out);
        let t = |core, busy, total| CpuTimes { core, busy, total };
        assert_eq!(
            out,
            vec![t(None, 150, 1000), t(Some(0), 75, 500), t(Some(1), 75, 500)]
        );
        parse_stat(stat, false, &mut out);
        assert_eq!(out, vec![t(None, 150, 1000)]);
        let mem = b"MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\nBuffers: 1 kB\nSwapTotal: 8 kB\nSwapFree: 2 kB\n";
        let m = parse_meminfo(mem).unwrap();
        assert_eq!(
            (m.total, m.available, m.swap_total, m.swap_free),
            (1_024_000, 409_600, 8192, 2048)
        );
        assert_eq!(parse_meminfo(b"MemTotal: 1 kB\nSwapFree: 1 kB\n"), None);
        let net = b"h1\nh2\n    lo: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n  eth0: 100 1 0 0 0 0 0 0 200 1 0 0 0 0 0 0\n  ifb0: 7 1 0 0 0 0 0 0 9 1 0 0 0 0 0 0\n";
        assert_eq!(parse_netdev(net, &["eth0".into()]), (100, 200));
        assert_eq!(
            parse_netdev(net, &["eth0".into(), "ifb0".into()]),
            (107, 209)
        );
        let pstat = b"42 (py th) on) S 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 5 0 1 100 250 18446744073709551615";
        assert_eq!(parse_pid_stat(pstat), Some((250, 10)));
        assert_eq!(parse_statm_rss(b"1000 250 30 1 0 90 0\n"), Some(250));
        let block = b"  100 0 2000 5 50 0 4000 7 0 9 12 0 0 0 0\n";
        assert_eq!(parse_block_stat(block), (2000 * 512, 4000 * 512));
    }

    #[test]
    fn reads_own_proc_files_again_and_again() {
        let mut f = ProcFile::open("/proc/self/stat").unwrap();
        let a = f.read().unwrap().to_vec();
        let b = f.read().unwrap().to_vec();
        assert!(parse_pid_stat(&a).is_some() && parse_pid_stat(&b).is_some());
        let mut m = ProcFile::open("/proc/self/statm").unwrap();
        assert!(parse_statm_rss(m.read().unwrap()).unwrap() > 0);
    }

    #[test]
    fn task_dir_counts_threads() {
        let t = TaskDir::open(std::process::id()).expect("procfs counts threads in nlink");
        // Other tests start and end threads meanwhile: look for a quiet moment
        // in which the link count and the directory listing agree.
        let agree = (0..200).any(|_| {
            let a = t.threads().unwrap();
            let listed = t.tids().len() as u64;
            a == listed && t.threads().unwrap() == a
        });
        assert!(agree, "nlink - 2 never matched the task listing");
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let hs: Vec<_> = (0..16)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || rx.lock().map(|r| r.recv().ok()).ok())
            })
            .collect();
        assert!(t.threads().unwrap() >= 17);
        drop(tx);
        for h in hs {
            h.join().unwrap();
        }
    }

    #[test]
    fn network_counters_of_chosen_interfaces() {
        let ifaces = net_interfaces();
        assert!(!ifaces.iter().any(|i| i == "lo"));
        let backed: Vec<_> = ifaces
            .iter()
            .filter(|i| Path::new(&format!("/sys/class/net/{i}/device")).exists())
            .collect();
        // Either only device-backed interfaces, or (none exist) all but lo.
        assert!(backed.is_empty() || backed.len() == ifaces.len());
        if !ifaces.is_empty() {
            let mut src = NetSource::open(&ifaces).expect("counters readable");
            let (rx0, _) = src.read().unwrap();
            let (rx1, _) = src.read().unwrap();
            assert!(rx1 >= rx0);
        }
    }

    #[test]
    fn sysinfo_reads_the_load() {
        assert!(load1().unwrap() >= 0.0);
    }
}
