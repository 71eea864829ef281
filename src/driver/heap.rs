//! The heap of rank processes on transparent huge pages.
//!
//! Message logging keeps what a rank sends (and, under `ulml`, each
//! collective's result) until a checkpoint makes it unnecessary. Memory that
//! is kept cannot be reused, so every logged buffer is memory fresh from the
//! kernel: one page fault and one zeroed page per 4 KiB. On CG class W (2
//! ranks, threads backend, no checkpoint) that was 5,400 extra page faults
//! per run under `ulml` and 8,100 under `pessimistic`, and it was all of
//! their failure-free overhead (`lazarus bench cg --class W --ranks 2
//! --protocols none,pessimistic,ulml --checkpoint-every 1000000`: paired
//! ratios 1.12 and 1.10 with glibc's defaults, 1.00–1.02 with the heap on
//! huge pages, alternating in the same minute).
//!
//! glibc puts its heap on transparent huge pages when asked through
//! `GLIBC_TUNABLES`: `glibc.malloc.hugetlb=1` makes it `madvise` the memory
//! it gets from the kernel (where the kernel's THP mode is `madvise`; in
//! mode `always` every large enough region gets huge pages anyway), and
//! `glibc.malloc.top_pad` makes it grow the heap in steps of 32 MiB, so
//! that whole 2 MiB pages fit in it (with the default step of 128 KiB the
//! page-fault count did not move; 8 MiB halved it; 32 MiB took it from
//! 8,400 to 200). Tunables are read when a process
//! starts, so this module only says what to put in a new process's
//! environment: the launcher gives it to the rank processes it starts, and
//! the `lazarus` command runs itself again with it.
//!
//! Nothing is set when `GLIBC_TUNABLES` is already set (the user's choice
//! stands), when `LAZARUS_HEAP` is set (`LAZARUS_HEAP=default` asks for
//! glibc's defaults; the `lazarus` command sets `huge-pages` when it runs
//! itself again, so that it does so once even where the loader drops
//! `GLIBC_TUNABLES`, as it does for set-user-ID programs), when the kernel
//! has transparent huge pages off (`never`), or on a system other than
//! Linux with glibc.
//!
//! glibc 2.35 and 2.36 (Debian 12's) honour `glibc.malloc.hugetlb=1` only
//! by chance: the function that reads the kernel's THP mode compares a
//! buffer it never terminated, so the comparison depends on one byte of
//! stale stack, which differs from one start of a process to the next
//! (ASLR). Here 7 of 12 rank processes started without it (their heap and
//! arenas not advised, `top_pad` applied). [`run_again_with_heap_setting`]
//! therefore looks at its own heap after starting with the setting and, if
//! glibc missed it, runs the program again (at most [`MAX_HEAP_TRIES`]
//! starts in all), which gives it a new stack layout.
//!
//! A program of one's own gets the same by calling
//! [`run_again_with_heap_setting`] first thing in `main` (the `lazarus`
//! command and the examples do): needed for the threads backend, where the
//! ranks are threads of that program; rank processes the launcher starts
//! get the setting from it either way.

/// The variable glibc reads its tunables from.
pub const GLIBC_TUNABLES: &str = "GLIBC_TUNABLES";

/// Set to `default` to leave the heap as glibc sets it up (any value
/// stops [`huge_page_tunables`] from asking for anything).
pub const LAZARUS_HEAP: &str = "LAZARUS_HEAP";

/// What the `lazarus` command sets [`LAZARUS_HEAP`] to when it runs itself
/// again with [`HUGE_PAGE_TUNABLES`].
pub const HEAP_HUGE_PAGES: &str = "huge-pages";

/// Heap on transparent huge pages, grown 32 MiB at a time.
pub const HUGE_PAGE_TUNABLES: &str = "glibc.malloc.hugetlb=1:glibc.malloc.top_pad=33554432";

/// What a process started now should have as `GLIBC_TUNABLES` to get its
/// heap on huge pages, or `None` when it should inherit the environment as
/// it is (see the module docs).
pub fn huge_page_tunables() -> Option<&'static str> {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return None;
    }
    if std::env::var_os(GLIBC_TUNABLES).is_some() || std::env::var_os(LAZARUS_HEAP).is_some() {
        return None;
    }
    thp_usable(&thp_mode()?).then_some(HUGE_PAGE_TUNABLES)
}

/// Counts the starts of a process that found glibc had missed the heap
/// setting and ran itself again (see the module docs).
pub const LAZARUS_HEAP_TRIES: &str = "LAZARUS_HEAP_TRIES";

/// The most starts of one process that [`run_again_with_heap_setting`]
/// makes to get the heap setting honoured (each one about 1 ms; with
/// glibc missing it about half the time, 16 leave about one process in
/// 20,000 without it).
pub const MAX_HEAP_TRIES: u32 = 16;

/// The tunable that asks glibc to advise its heap for huge pages.
const HUGETLB_TUNABLE: &str = "glibc.malloc.hugetlb=1";

/// Run this program again, in place (`exec` of `/proc/self/exe` with the
/// same arguments), with [`huge_page_tunables`] in its environment and
/// [`LAZARUS_HEAP`] set to [`HEAP_HUGE_PAGES`], so that it happens once
/// even where the loader drops `GLIBC_TUNABLES`. A process started with
/// `glibc.malloc.hugetlb=1` (by this function, or by the launcher, as rank
/// processes are) whose heap glibc nevertheless did not advise for huge
/// pages runs itself again too, up to [`MAX_HEAP_TRIES`] starts (see the
/// module docs). Call it first thing in `main`, before any thread starts
/// or file opens.
///
/// Returns `Ok(())` at once when there is nothing to do (see the module
/// docs) or the program runs under valgrind, never returns when the
/// program runs again, and returns the error of `exec` when that fails
/// (the program can carry on with glibc's defaults: slower under message
/// logging, not wrong).
pub fn run_again_with_heap_setting() -> std::io::Result<()> {
    // Under valgrind (its preloaded library is there), `/proc/self/exe`
    // is valgrind's tool, which refuses to start that way: profile the
    // program as it was started.
    if std::env::var_os("LD_PRELOAD").is_some_and(|p| p.to_string_lossy().contains("vgpreload")) {
        return Ok(());
    }
    if let Some(tunables) = huge_page_tunables() {
        return run_again(&[
            (GLIBC_TUNABLES, tunables.to_string()),
            (LAZARUS_HEAP, HEAP_HUGE_PAGES.to_string()),
        ]);
    }
    let tries: u32 = std::env::var(LAZARUS_HEAP_TRIES)
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    if tries < MAX_HEAP_TRIES && hugetlb_missed() {
        return run_again(&[(LAZARUS_HEAP_TRIES, (tries + 1).to_string())]);
    }
    Ok(())
}

/// `exec` this program again with the same arguments and `env` added.
fn run_again(env: &[(&str, String)]) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let mut args = std::env::args_os();
        let argv0 = args.next().unwrap_or_default();
        Err(std::process::Command::new("/proc/self/exe")
            .arg0(argv0)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .exec())
    }
    #[cfg(not(unix))]
    {
        let _ = env;
        Ok(())
    }
}

/// Whether this process asked glibc for an advised heap (the loader
/// leaves `GLIBC_TUNABLES` cut at its first tunable, hence `contains`),
/// the kernel's THP mode is `madvise` (in mode `always` glibc advises
/// nothing and needs not), and its main heap is not advised.
fn hugetlb_missed() -> bool {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return false;
    }
    let asked = std::env::var(GLIBC_TUNABLES).is_ok_and(|t| t.contains(HUGETLB_TUNABLE));
    if !asked {
        return false;
    }
    let madvise = thp_mode().is_some_and(|m| m.contains("[madvise]"));
    if !madvise {
        return false;
    }
    // The heap exists once something is allocated (glibc creates it, with
    // its `top_pad`, on the first allocation).
    std::hint::black_box(Box::new(0u64));
    std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|s| main_heap(&s))
        .is_some_and(|heap| !heap.advised)
}

/// The main heap (`[heap]`) of a process, as its `/proc/PID/smaps` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MainHeap {
    /// Its size in bytes.
    pub bytes: u64,
    /// Whether it is advised for transparent huge pages (flag `hg`, which
    /// glibc's `glibc.malloc.hugetlb=1` sets with `madvise`).
    pub advised: bool,
}

/// The main heap in the text of a `/proc/PID/smaps`, or `None` when there
/// is no heap (or its entry lacks its size or flags).
pub fn main_heap(smaps: &str) -> Option<MainHeap> {
    let mut lines = smaps.lines().skip_while(|l| !l.ends_with("[heap]")).skip(1);
    let mut bytes = None;
    for l in lines.by_ref() {
        if let Some(kb) = l.strip_prefix("Size:") {
            bytes = kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok();
        }
        if let Some(flags) = l.strip_prefix("VmFlags:") {
            return Some(MainHeap {
                bytes: bytes? * 1024,
                advised: flags.split_whitespace().any(|f| f == "hg"),
            });
        }
    }
    None
}

/// The kernel's THP mode: the contents of
/// `/sys/kernel/mm/transparent_hugepage/enabled`, the active one in
/// brackets.
fn thp_mode() -> Option<String> {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()
}

/// Whether the kernel's THP mode (the contents of
/// `/sys/kernel/mm/transparent_hugepage/enabled`, the active one in
/// brackets) gives huge pages to memory that asks for them.
fn thp_usable(mode: &str) -> bool {
    mode.contains("[always]") || mode.contains("[madvise]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_pages_only_where_the_kernel_gives_them() {
        assert!(thp_usable("always [madvise] never\n"));
        assert!(thp_usable("[always] madvise never\n"));
        assert!(!thp_usable("always madvise [never]\n"));
        assert!(!thp_usable(""));
    }

    #[test]
    fn the_main_heap_is_read_with_its_size_and_its_advice() {
        let map = |flags: &str| {
            format!(
                "5600-5700 r-xp 0 fe:00 1 /bin/x\nSize: 4 kB\nVmFlags: rd ex mr hg\n\
                 5800-5900 rw-p 0 00:00 0                          [heap]\n\
                 Size:              34816 kB\nAnonHugePages: 0 kB\nVmFlags: {flags}\n\
                 7f00-7f10 rw-p 0 00:00 0 \nSize: 4 kB\nVmFlags: rd wr hg\n"
            )
        };
        let heap = |advised| {
            Some(MainHeap {
                bytes: 34816 * 1024,
                advised,
            })
        };
        assert_eq!(main_heap(&map("rd wr mr mw me ac hg")), heap(true));
        // Another mapping's `hg` (before or after the heap) does not count.
        assert_eq!(main_heap(&map("rd wr mr mw me ac")), heap(false));
        assert_eq!(main_heap(&map("rd wr mr mw me ac nh")), heap(false));
        assert_eq!(
            main_heap("5600-5700 r-xp 0 fe:00 1 /bin/x\nVmFlags: hg\n"),
            None
        );
    }
}
