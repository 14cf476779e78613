"""Pause and resume through vmmshim.torch_memory_saver, in each of its modes, and the disk mode
against the disk's own sequential speed (make bench, step tms).

    LD_PRELOAD=build/libvmmshim.so PYTHONPATH=scripts/python python3 bench/tms_bench.py [--gib 8]

8 GiB in 64 MiB tensors per mode, in regions of their own tags: no backup (discard), CPU backup
(host; retain_cpu_backup on, as a loop that pauses again keeps it) and disk backup (disk), three
pause/resume cycles each (the first obtains host memory and staging buffers; the later ones are
the steady state). The bytes are checked after every resume (host and disk keep every one).

Then, in the directory the disk mode writes to (BENCH_DISK_DIR, else $TMPDIR, else /tmp), dd
writes and reads a file of the same size with direct I/O (oflag=direct, iflag=direct; without
them where the filesystem refuses them, said in the record), in blocks of DD_BS (128 MiB: no
smaller than what the disk mode has under way at once, four reads of 32 MiB at a wake), and the
disk mode's steady pause and resume speeds are printed as a ratio of dd's (the target: 0.8 or
more). While each disk cycle is paused (outside its timings), a record gives the tag's files:
their count, bytes, the bytes the disk allocated for them and their extents (`filefrag`, where
installed), and the page cache's size (/proc/meminfo Cached) before the pause and after it: what
tells a cycle that slows down from fragmentation, from files left behind or from the cache.
dd's file stays during the cycles and is read again after them: a disk that itself got slower
meanwhile (a cloud volume's burst spent) shows there. When the directory
has less free space than the tag and dd's file need, the disk mode and dd are skipped with a
line that says so. Fewer disk cycles run when dd says the disk is too slow for 90 s.

Prints "R tms ..." records (bench/report.py reads them) and INFO lines."""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
GiB = 1 << 30
BLOCK = 64 * MiB
DD_BS = 128 * MiB


def rec(**kw):
    print("R tms " + " ".join("%s=%s" % (k, v) for k, v in kw.items()))
    sys.stdout.flush()


def make(torch, tms, tag, gib, **region):
    with tms.region(tag=tag, **region):
        ts = [torch.full((BLOCK // 4,), i + 1, dtype=torch.int32, device="cuda") for i in range(gib * GiB // BLOCK)]
    torch.cuda.synchronize()
    return ts


def wrong(torch, ts, zero):
    """Tensors whose words are not what they were given (zeros when zero)."""
    bad = 0
    for i, t in enumerate(ts):
        want = 0 if zero else i + 1
        bad += int((t != want).any().item())
    return bad


def cached_bytes():
    """The page cache's size (/proc/meminfo Cached), or -1."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("Cached:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def extents(path):
    """The file's extents as filefrag counts them, or -1 (no filefrag, or it failed)."""
    try:
        r = subprocess.run(["filefrag", path], capture_output=True, text=True, timeout=30)
        return int(r.stdout.rsplit(":", 1)[1].split()[0]) if r.returncode == 0 else -1
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return -1


def disk_files(d, cycle, cached0):
    """A record of the disk mode's files while the tag is paused."""
    files = [os.path.join(d, f) for f in os.listdir(d) if f.startswith("vmmshim-")]
    st = [os.stat(f) for f in files]
    ext = [extents(f) for f in files]
    rec(files="disk", cycle=cycle, count=len(files), bytes=sum(s.st_size for s in st),
        allocated=sum(s.st_blocks * 512 for s in st), extents=-1 if -1 in ext else sum(ext),
        cached_before=cached0, cached_paused=cached_bytes())


def cycles(torch, tms, mode, tag, ts, n, gib, paused=None):
    pauses, resumes = [], []
    for c in range(1, n + 1):
        torch.cuda.synchronize()
        cached0 = cached_bytes()
        t0 = time.perf_counter()
        tms.pause(tag)
        t1 = time.perf_counter()
        if paused:
            paused(c, cached0)
            t1b = time.perf_counter()
        else:
            t1b = t1
        tms.resume(tag)
        t2 = time.perf_counter()
        bad = wrong(torch, ts, zero=(mode == "discard"))
        p, r = (t1 - t0) * 1e3, (t2 - t1b) * 1e3
        rec(mode=mode, cycle=c, gib=gib, pause_ms="%.2f" % p, resume_ms="%.2f" % r,
            pause_gibps="%.2f" % (gib / (p / 1e3)), resume_gibps="%.2f" % (gib / (r / 1e3)), bad=bad)
        pauses.append(p)
        resumes.append(r)
    return pauses, resumes


def dd(args):
    """Runs dd; (seconds, stderr's last line) or (None, why)."""
    t0 = time.perf_counter()
    r = subprocess.run(["dd"] + args, capture_output=True, text=True, timeout=120)
    t = time.perf_counter() - t0
    last = (r.stderr.strip().splitlines() or [""])[-1]
    return (t, last) if r.returncode == 0 else (None, last)


def dd_read(path, gib, direct):
    """dd's read speed (GiB/s) of the file at path, or None."""
    if not direct:  # buffered: the read must not come from the page cache
        subprocess.run(["sh", "-c", "sync; echo 1 > /proc/sys/vm/drop_caches"], capture_output=True)
    r, why = dd(["if=" + path, "of=/dev/null", "bs=%dM" % (DD_BS // MiB)] + (["iflag=direct"] if direct else []))
    if r is None:
        print("INFO dd read failed: %s" % why)
    return gib / r if r else None


def dd_speeds(d, gib):
    """dd's write and read speeds (GiB/s) of a gib-GiB file in d, and whether direct I/O was used.
    The file stays (d/dd-test), to be read again after the disk cycles."""
    path = os.path.join(d, "dd-test")
    count = gib * GiB // DD_BS
    for direct in (True, False):
        w, why = dd(["if=/dev/zero", "of=" + path, "bs=%dM" % (DD_BS // MiB), "count=%d" % count, "conv=fsync"] +
                    (["oflag=direct"] if direct else []))
        if w is None:
            if os.path.exists(path):
                os.unlink(path)
            print("INFO dd write%s failed: %s" % (" with oflag=direct" if direct else "", why))
            continue
        r = dd_read(path, gib, direct)
        return (gib / w, r, direct) if r else None
    return None


def disk_part(torch, tms, gib, base):
    d = tempfile.mkdtemp(prefix="vmmshim-tms-bench-", dir=base)
    try:
        free = shutil.disk_usage(d).free
        fs = subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip() or "?"
        need = 2 * gib * GiB + GiB
        if free < need:
            rec(skip="disk", why="%s-has-%.1f-GiB-free,-%d-GiB-needed" % (d, free / GiB, need // GiB))
            print("SKIP disk mode and dd: %s has %.1f GiB free, %d GiB needed" % (d, free / GiB, need // GiB))
            return
        speeds = dd_speeds(d, gib)
        if not speeds:
            rec(skip="disk", why="dd-failed")
            return
        wr, rd, direct = speeds
        rec(dd="write", gib=gib, gibps="%.2f" % wr, direct=int(direct), fs=fs, bs_mib=DD_BS // MiB)
        rec(dd="read", gib=gib, gibps="%.2f" % rd, direct=int(direct), fs=fs, bs_mib=DD_BS // MiB)
        print("INFO dd in %s (%s), bs=%dM%s: write %.2f GiB/s, read %.2f GiB/s (the disk mode: pieces of 32 MiB, "
              "up to 4 reads in flight at a wake)" % (d, fs, DD_BS // MiB, ", direct I/O" if direct else ", buffered",
                                                       wr, rd))
        per_cycle = gib / wr + gib / rd
        n = 3 if 3 * per_cycle <= 60 else 2 if 2 * per_cycle <= 75 else 1
        if n < 3:
            print("INFO the disk writes %.2f and reads %.2f GiB/s: %d disk cycle(s), to stay within 90 s" % (wr, rd, n))
        tms.set_disk_backup_dir(d)
        ts = make(torch, tms, "bench_disk", gib, enable_disk_backup=True)
        pauses, resumes = cycles(torch, tms, "disk", "bench_disk", ts, n, gib,
                                 paused=lambda c, cached0: disk_files(d, c, cached0))
        steady = slice(1, None) if n > 1 else slice(0, None)
        p, r = statistics.median(pauses[steady]), statistics.median(resumes[steady])
        rp, rr = (gib / (p / 1e3)) / wr, (gib / (r / 1e3)) / rd
        rec(ratio="pause", value="%.2f" % rp, target="0.8", disk_gibps="%.2f" % (gib / (p / 1e3)), dd_gibps="%.2f" % wr)
        rec(ratio="resume", value="%.2f" % rr, target="0.8", disk_gibps="%.2f" % (gib / (r / 1e3)), dd_gibps="%.2f" % rd)
        print("INFO disk mode in %s (%s): pause %.2f GiB/s = %.2f of dd's write (target 0.8), resume %.2f GiB/s = "
              "%.2f of dd's read" % (d, fs, gib / (p / 1e3), rp, gib / (r / 1e3), rr))
        again = dd_read(os.path.join(d, "dd-test"), gib, direct)
        if again:  # the disk itself slower now (a cloud volume's burst spent, say) shows here
            rec(dd="read-after", gib=gib, gibps="%.2f" % again, direct=int(direct), fs=fs, bs_mib=DD_BS // MiB)
            print("INFO dd read again after the disk cycles: %.2f GiB/s (before them %.2f)" % (again, rd))
        rec(files_left=len([f for f in os.listdir(d) if f.startswith("vmmshim-")]))
        del ts
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=int, default=8)
    a = ap.parse_args()
    import torch
    from vmmshim.torch_memory_saver import torch_memory_saver as tms
    if not tms.enabled:
        print("vmmshim: the shim is not preloaded")
        return 1
    tms.retain_cpu_backup = True  # a loop that pauses again keeps its host memory (steady state)
    print("INFO torch %s, %s, %d GiB in 64 MiB tensors per mode" % (torch.__version__, torch.cuda.get_device_name(),
                                                                   a.gib))
    for mode, region in (("discard", {}), ("host", {"enable_cpu_backup": True})):
        ts = make(torch, tms, "bench_" + mode, a.gib, **region)
        cycles(torch, tms, mode, "bench_" + mode, ts, 3, a.gib)
        del ts
    base = os.environ.get("BENCH_DISK_DIR") or os.environ.get("TMPDIR") or "/tmp"
    disk_part(torch, tms, a.gib, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
