//! Which CPUs take a device's completion interrupts, and keeping a thread
//! off them (decision 0083).
//!
//! On a disk with one request queue (virtio-blk here, SATA/AHCI, many
//! HBAs) every completion interrupt lands on one CPU, and so does the
//! kernel work it queues there (the direct-I/O completion that issues an
//! O_DSYNC write's cache flush runs in a kworker bound to that CPU). A
//! CPU-bound thread on the same CPU delays that work, and with it every
//! sync write. The txg sync thread keeps off those CPUs when others are
//! allowed; a disk with a queue per CPU (NVMe, multi-queue virtio) spreads
//! its interrupts over all of them and nothing changes.
//!
//! The device is found through sysfs: the block device holding a path
//! (its parent disk for a partition, the disks under a device-mapper or md
//! device), then up from its `device` link to the first directory with
//! `msi_irqs/` (or an `irq` file). Interrupts that hardly fire (a virtio
//! config or an NVMe admin queue: under 1% of the device's count in
//! `/proc/interrupts`) are ignored; the others' `effective_affinity_list`
//! (or `smp_affinity_list`) names the CPUs.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A set of CPU numbers.
pub type CpuSet = BTreeSet<usize>;

/// Where sysfs and procfs are (the real ones, or a test's copy).
#[derive(Debug, Clone)]
struct Roots {
    sys: PathBuf,
    proc: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            sys: PathBuf::from("/sys"),
            proc: PathBuf::from("/proc"),
        }
    }
}

/// Stacked block devices followed at most this deep (dm on md on disks).
const MAX_DEPTH: usize = 4;

/// CPUs that take the completion interrupts of the disk(s) holding `path`
/// (a file or a block device); `None` when that cannot be told (a
/// filesystem without a block device such as tmpfs, a loop device, a
/// bucket, no sysfs).
pub fn completion_cpus(path: &Path) -> Option<CpuSet> {
    completion_cpus_in(&Roots::default(), path)
}

/// As [`completion_cpus`] under other sysfs/procfs roots (tests).
fn completion_cpus_in(roots: &Roots, path: &Path) -> Option<CpuSet> {
    let meta = std::fs::metadata(path).ok()?;
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let block = roots.sys.join(format!("dev/block/{major}:{minor}"));
    let counts = interrupt_counts(&roots.proc.join("interrupts"));
    let mut devices = Vec::new();
    device_irqs(roots, &block, 0, &mut devices)?;
    let mut cpus = CpuSet::new();
    for irqs in devices {
        let count = |i: &u32| counts.get(i).copied().unwrap_or(0);
        let total: u64 = irqs.iter().map(count).sum();
        for irq in irqs {
            // A queue that hardly fires (config, admin) says nothing about
            // where the device's completions land; with no counts at all,
            // each one counts.
            if total > 0 && count(&irq) * 100 < total {
                continue;
            }
            let dir = roots.proc.join(format!("irq/{irq}"));
            let list = std::fs::read_to_string(dir.join("effective_affinity_list"))
                .or_else(|_| std::fs::read_to_string(dir.join("smp_affinity_list")))
                .ok()?;
            cpus.extend(parse_cpu_list(&list)?);
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Adds the interrupts of each device under the block device at sysfs
/// `block` (a `/sys/dev/block/M:m` link or a `/sys/block/NAME` directory),
/// one set per device; `None` when some device under it has none to tell.
fn device_irqs(
    roots: &Roots,
    block: &Path,
    depth: usize,
    out: &mut Vec<BTreeSet<u32>>,
) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut disk = std::fs::canonicalize(block).ok()?;
    if disk.join("partition").exists() {
        disk = disk.parent()?.to_path_buf();
    }
    // device-mapper, md: the devices it is made of.
    let slaves: Vec<PathBuf> = std::fs::read_dir(disk.join("slaves"))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    if !slaves.is_empty() {
        for s in slaves {
            device_irqs(roots, &s, depth + 1, out)?;
        }
        return Some(());
    }
    let mut dir = std::fs::canonicalize(disk.join("device")).ok()?;
    let top = std::fs::canonicalize(roots.sys.join("devices")).ok()?;
    while dir.starts_with(&top) && dir != top {
        if let Ok(entries) = std::fs::read_dir(dir.join("msi_irqs")) {
            let irqs: BTreeSet<u32> = entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .collect();
            if !irqs.is_empty() {
                out.push(irqs);
                return Some(());
            }
        }
        if let Some(irq) = std::fs::read_to_string(dir.join("irq"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .filter(|&i| i > 0)
        {
            out.push(BTreeSet::from([irq]));
            return Some(());
        }
        dir = dir.parent()?.to_path_buf();
    }
    None
}

/// Each numbered interrupt's count over all CPUs, from `/proc/interrupts`
/// (empty when it cannot be read).
fn interrupt_counts(path: &Path) -> std::collections::HashMap<u32, u64> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Default::default();
    };
    let mut lines = text.lines();
    let ncpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    lines
        .filter_map(|l| {
            let (irq, rest) = l.split_once(':')?;
            let irq = irq.trim().parse::<u32>().ok()?;
            let n = rest
                .split_whitespace()
                .take(ncpus)
                .map_while(|c| c.parse::<u64>().ok())
                .sum();
            Some((irq, n))
        })
        .collect()
}

/// Parses a kernel CPU list ("0-3,8,10-11"); `None` if malformed.
pub fn parse_cpu_list(s: &str) -> Option<CpuSet> {
    let mut out = CpuSet::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        // Bounded: CPU_SETSIZE is the most sched_setaffinity takes here.
        if a > b || b >= libc::CPU_SETSIZE as usize {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

/// The CPUs the calling thread may run on.
pub fn thread_cpus() -> io::Result<CpuSet> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live cpu_set_t of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Lets the calling thread run only on `cpus` (all below CPU_SETSIZE).
pub fn set_thread_cpus(cpus: &CpuSet) -> io::Result<()> {
    // SAFETY: as in `thread_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a live cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Where a thread that must not delay completions should run: the CPUs
/// of `allowed` that take none of `irq`'s interrupts, if there are any and
/// `irq` takes some of `allowed` (otherwise nothing to avoid or nowhere to go).
pub fn away_from(allowed: &CpuSet, irq: &CpuSet) -> Option<CpuSet> {
    let rest: CpuSet = allowed.difference(irq).copied().collect();
    (!rest.is_empty() && rest.len() < allowed.len()).then_some(rest)
}

/// A CPU list as the kernel writes it ("0-3,8").
pub fn format_cpu_list(cpus: &CpuSet) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = cpus.iter().copied().peekable();
    while let Some(a) = it.next() {
        let mut b = a;
        while it.peek() == Some(&(b + 1)) {
            b += 1;
            it.next();
        }
        out.push(if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        });
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn set(v: &[usize]) -> CpuSet {
        v.iter().copied().collect()
    }

    #[test]
    fn cpu_lists_parse_and_print_as_the_kernel_writes_them() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(set(&[0, 1, 2, 3, 8, 10, 11]))
        );
        assert_eq!(parse_cpu_list("1"), Some(set(&[1])));
        assert_eq!(parse_cpu_list(""), Some(set(&[])));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list("0-99999999"), None);
        assert_eq!(
            format_cpu_list(&set(&[0, 1, 2, 3, 8, 10, 11])),
            "0-3,8,10-11"
        );
        assert_eq!(format_cpu_list(&set(&[])), "");
    }

    #[test]
    fn away_from_needs_somewhere_to_go_and_something_to_avoid() {
        assert_eq!(away_from(&set(&[0, 1]), &set(&[1])), Some(set(&[0])));
        assert_eq!(away_from(&set(&[0, 1]), &set(&[0, 1])), None);
        assert_eq!(away_from(&set(&[0, 1]), &set(&[2])), None);
        assert_eq!(
            away_from(&set(&[0, 1, 2, 3]), &set(&[1, 7])),
            Some(set(&[0, 2, 3]))
        );
    }

    /// A sysfs and procfs copy: block device `maj:min` of a disk (or of a
    /// partition on it) whose PCI function has MSI interrupts `irqs`, each
    /// with a count and an effective affinity.
    struct Tree {
        dir: tempfile::TempDir,
    }

    impl Tree {
        fn new(interrupts: &str) -> Tree {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("sys/dev/block")).unwrap();
            std::fs::create_dir_all(dir.path().join("proc/irq")).unwrap();
            std::fs::write(dir.path().join("proc/interrupts"), interrupts).unwrap();
            Tree { dir }
        }
        fn roots(&self) -> Roots {
            Roots {
                sys: self.dir.path().join("sys"),
                proc: self.dir.path().join("proc"),
            }
        }
        fn p(&self, rel: &str) -> PathBuf {
            self.dir.path().join(rel)
        }
        fn irq(&self, n: u32, effective: &str) {
            std::fs::create_dir_all(self.p(&format!("proc/irq/{n}"))).unwrap();
            std::fs::write(
                self.p(&format!("proc/irq/{n}/effective_affinity_list")),
                effective,
            )
            .unwrap();
        }
        /// A disk under PCI function `pci` with `irqs`; returns its sysfs dir.
        fn disk(&self, name: &str, pci: &str, irqs: &[u32]) -> PathBuf {
            let func = self.p(&format!("sys/devices/pci0000:00/{pci}"));
            std::fs::create_dir_all(func.join("msi_irqs")).unwrap();
            for i in irqs {
                std::fs::write(func.join(format!("msi_irqs/{i}")), "msi").unwrap();
            }
            let virtio = func.join(format!("virtio-{name}"));
            let disk = virtio.join(format!("block/{name}"));
            std::fs::create_dir_all(&disk).unwrap();
            symlink(&virtio, disk.join("device")).unwrap();
            disk
        }
        fn link(&self, maj_min: &str, target: &Path) {
            symlink(target, self.p(&format!("sys/dev/block/{maj_min}"))).unwrap();
        }
    }

    // The devices' numbers of a real file on this machine, to point sysfs at.
    fn own_dev() -> (tempfile::NamedTempFile, String) {
        let f = tempfile::NamedTempFile::new().unwrap();
        let d = std::fs::metadata(f.path()).unwrap().dev();
        (f, format!("{}:{}", libc::major(d), libc::minor(d)))
    }

    const INTERRUPTS: &str = "           CPU0       CPU1       CPU2       CPU3\n\
         35:          0          1          0          0  PCI-MSIX-0000:00:02.0   0-edge      virtio1-config\n\
         36:          0   98127993          0          0  PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n\
         NMI:          0          0          0          0   Non-maskable interrupts\n";

    #[test]
    fn a_single_queue_disk_takes_its_completions_where_its_busy_interrupt_points() {
        let t = Tree::new(INTERRUPTS);
        let (f, mm) = own_dev();
        let disk = t.disk("vda", "0000:00:02.0", &[35, 36]);
        t.link(&mm, &disk);
        // The config interrupt points elsewhere and hardly fires: ignored.
        t.irq(35, "3\n");
        t.irq(36, "1\n");
        assert_eq!(completion_cpus_in(&t.roots(), f.path()), Some(set(&[1])));
    }

    #[test]
    fn a_partition_is_its_disk_and_a_mapper_device_its_parts() {
        let t = Tree::new(INTERRUPTS);
        let (f, mm) = own_dev();
        let disk = t.disk("vda", "0000:00:02.0", &[35, 36]);
        t.irq(35, "3");
        t.irq(36, "1");
        let part = disk.join("vda1");
        std::fs::create_dir_all(&part).unwrap();
        std::fs::write(part.join("partition"), "1").unwrap();
        // dm-0 made of vda1 and of a second disk whose one queue is on CPU 2.
        let other = t.disk("vdb", "0000:00:03.0", &[40]);
        t.irq(40, "2");
        let dm = t.p("sys/devices/virtual/block/dm-0");
        std::fs::create_dir_all(dm.join("slaves")).unwrap();
        symlink(&part, dm.join("slaves/vda1")).unwrap();
        symlink(&other, dm.join("slaves/vdb")).unwrap();
        t.link(&mm, &part);
        assert_eq!(completion_cpus_in(&t.roots(), f.path()), Some(set(&[1])));
        std::fs::remove_file(t.p(&format!("sys/dev/block/{mm}"))).unwrap();
        t.link(&mm, &dm);
        assert_eq!(completion_cpus_in(&t.roots(), f.path()), Some(set(&[1, 2])));
    }

    #[test]
    fn a_queue_per_cpu_covers_every_cpu() {
        let t =
            Tree::new("  CPU0 CPU1\n 50: 10 0 nvme0q0\n 51: 5000 0 nvme0q1\n 52: 0 4000 nvme0q2\n");
        let (f, mm) = own_dev();
        let disk = t.disk("nvme0n1", "0000:00:04.0", &[50, 51, 52]);
        t.link(&mm, &disk);
        t.irq(50, "0");
        t.irq(51, "0");
        t.irq(52, "1");
        let cpus = completion_cpus_in(&t.roots(), f.path()).unwrap();
        assert_eq!(cpus, set(&[0, 1]));
        assert_eq!(away_from(&set(&[0, 1]), &cpus), None);
    }

    #[test]
    fn no_device_behind_the_path_tells_nothing() {
        let t = Tree::new(INTERRUPTS);
        let (f, mm) = own_dev();
        // A virtual block device (loop, zram): no `device` link.
        let virt = t.p("sys/devices/virtual/block/loop0");
        std::fs::create_dir_all(&virt).unwrap();
        assert_eq!(completion_cpus_in(&t.roots(), f.path()), None);
        t.link(&mm, &virt);
        assert_eq!(completion_cpus_in(&t.roots(), f.path()), None);
        assert_eq!(
            completion_cpus_in(&t.roots(), Path::new("/no/such/file")),
            None
        );
    }

    #[test]
    fn a_thread_is_kept_where_it_is_told() {
        let before = thread_cpus().unwrap();
        assert!(!before.is_empty());
        let one = set(&[*before.iter().next().unwrap()]);
        std::thread::spawn(move || {
            set_thread_cpus(&one).unwrap();
            assert_eq!(thread_cpus().unwrap(), one);
        })
        .join()
        .unwrap();
        // Only the thread that asked moved.
        assert_eq!(thread_cpus().unwrap(), before);
    }
}
