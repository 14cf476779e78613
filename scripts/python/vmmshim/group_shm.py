"""A group's memory budget, read and changed while its members run: the verbs of
`vmmshim ctl --group NAME ...` (registered with groups.py when this module is imported).

    vmmshim ctl --group NAME limit SIZE     set the group's limit (creates the group when no
                                            member made it yet)
    vmmshim ctl --group NAME status [--json]  the limit, the totals, the members and their shares

SIZE is what VMMSHIM_LIMIT takes: 8G (every device together), 0:8G,1:4G (per device), both
(12G,0:8G), or 0 / none (no limit). It replaces the whole limit. Lowering the limit below what the
members map refuses their next growths and touches nothing they hold.

The group is the shared-memory segment /dev/shm/vmmshim-<uid>-<NAME> that the shim's processes of
that name and user share (src/handle/group.c; its layout is include/vmmshim/group.h, read here with
struct). As the shim does, the file is opened without following a symbolic link and checked (a
regular file of this user, no access for others) before any lock: another user's file could be
held locked by that user. Changes are made as the shim makes them: under flock(LOCK_EX) on the
segment, waited for LOCK_WAIT_S at most (past that: exit 1, the file named), with `busy` set to
this pid for the time of the change; the members' waiters are woken through the futex the shim
sleeps on (best effort: they look again within half a second anyway).

Exit status 0, 1 on an error (one line "vmmshim: error: ..." on stderr), 2 on a usage error.
"""
import ctypes
import errno
import fcntl
import json
import os
import stat
import struct
import sys
import time
import zlib

from . import text

MAGIC = b"VMMSHGRP"
VERSION = 2
DEVICES = 16
MEMBERS = 256
HEADER_SIZE = 512
MEMBER_SIZE = 336
SIZE = HEADER_SIZE + MEMBERS * MEMBER_SIZE
CRC_BYTES = 72
LIMIT_SOURCES = {0: "unset", 1: "a member's VMMSHIM_LIMIT", 2: "vmmshim ctl"}

# vs_group_header_t and vs_group_member_t (include/vmmshim/group.h), native byte order.
HEADER = struct.Struct("=8s6IQ32s6IQ16QQ16Q4Q2I104x")
MEMBER = struct.Struct("=IIQ16sQQ16Q16QiIQQII")
assert HEADER.size == HEADER_SIZE and MEMBER.size == MEMBER_SIZE
# Offsets of the fields this tool writes.
OFF_BUSY, OFF_SEQ, OFF_SOURCE, OFF_GEN, OFF_LIMIT_ALL, OFF_LIMITS = 76, 80, 88, 92, 96, 104
OFF_TOTAL_ALL, OFF_TOTALS, OFF_HOST_ALL, OFF_MEMBERS_N, OFF_WAITERS = 232, 240, 368, 400, 84
WAITING = 0xFFFF
LOCK_WAIT_S = 5.0  # the lock is waited for this long at most (the shim's VS_GROUP_LOCK_WAIT_NS)


class GroupError(Exception):
    pass


def parse_size(spec):
    """'64M', '2GiB', '1048576' -> bytes (as the shim's _vs_parse_size); ValueError otherwise."""
    v = None if spec.strip().lower() == "none" else text.parse_size(spec)
    if v is None or v >= 1 << 64:
        raise ValueError(spec)
    return v


def parse_limit(text):
    """VMMSHIM_LIMIT's syntax -> (every device, [per device])."""
    if text.strip().lower() in ("none", "off"):
        return 0, [0] * DEVICES
    every, per, seen_all, seen = 0, [0] * DEVICES, False, set()
    for item in text.split(","):
        if not item.strip():
            raise ValueError(text)
        if ":" in item:
            dev, size = item.split(":", 1)
            d = int(dev.strip()) if dev.strip().isdigit() else -1
            if not 0 <= d < DEVICES or d in seen:
                raise ValueError(text)
            seen.add(d)
            per[d] = parse_size(size)
        else:
            if seen_all:
                raise ValueError(text)
            seen_all = True
            every = parse_size(item)
    return every, per


def human(n):
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return "%.2f %s" % (n / (1 << shift), unit)
    return "%d B" % n


def shm_path(name):
    return "/dev/shm/vmmshim-%d-%s" % (os.geteuid(), name)


def name_ok(name):
    return 0 < len(name) < 32 and all(c.isalnum() and c.isascii() or c in "_.-" for c in name)


def pidns():
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def proc_start(pid):
    """(start time, state) of a process, None when there is none."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return "unknown"
    fields = data[data.rfind(")") + 1:].split()
    return int(fields[19]), fields[0]


def member_alive(pid, start):
    got = proc_start(pid)
    if got is None:
        return False
    if got == "unknown":
        return True
    return got[0] == start and got[1] not in ("Z", "X")


class Group:
    """An open, checked segment. Use as a context manager: the lock is held inside."""

    def __init__(self, name, create=False):
        if not name_ok(name):
            raise GroupError("'%s' is not a group name (1-31 of A-Z a-z 0-9 _ . -)" % name)
        self.name, self.path = name, shm_path(name)
        # No symbolic link followed, no FIFO waited on.
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            try:  # the existing segment first, as the shim opens it
                self.fd = os.open(self.path, flags)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    self.fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                    os.fchmod(self.fd, 0o600)
                except FileExistsError:
                    self.fd = os.open(self.path, flags)
        except FileNotFoundError:
            raise GroupError("no group '%s' of uid %d (%s does not exist: no member has started)" %
                             (name, os.geteuid(), self.path))
        except OSError as e:
            why = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
            raise GroupError("cannot open %s: %s" % (self.path, why))
        self.mm = None
        try:
            self._check_owner()  # before any lock: another user's file may be held locked by that user
            self._lock()
            st = os.fstat(self.fd)  # again under the lock: the size its creator gave it
            if st.st_size == 0:
                os.ftruncate(self.fd, SIZE)
                self._map()
                self._init_header()
            else:
                self._check(st.st_size)
        except BaseException:
            self.close()
            raise
        self._unlock()

    def _check_owner(self):
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise GroupError("%s is owned by uid %d with mode 0%o: not this user's own (uid %d, 0600); it is not "
                             "used: its owner or root can remove it, or choose another group name" %
                             (self.path, st.st_uid, st.st_mode & 0o777, os.geteuid()))

    # ---- the lock, as the shim takes it, waited for LOCK_WAIT_S at most
    def _lock(self):
        end, pause = time.monotonic() + LOCK_WAIT_S, 0.0001
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    raise GroupError("%s (uid %d) stayed locked by another process for %d s: a member of the group "
                                     "is stopped or hung in the middle of a change; resume or end it (fuser -v %s "
                                     "lists the processes that have it open)" % (self.path, os.geteuid(), LOCK_WAIT_S, self.path))
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        if self.mm is not None and self._u32(OFF_BUSY):
            self._recount()
            self._put_u32(OFF_BUSY, 0)

    def _unlock(self):
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def __enter__(self):
        self._lock()
        return self

    def __exit__(self, *exc):
        self._unlock()

    def close(self):
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # ---- raw fields
    def _map(self):
        import mmap
        self.mm = mmap.mmap(self.fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def _u32(self, off):
        return struct.unpack_from("=I", self.mm, off)[0]

    def _put_u32(self, off, v):
        struct.pack_into("=I", self.mm, off, v & 0xFFFFFFFF)

    def _put_u64(self, off, v):
        struct.pack_into("=Q", self.mm, off, v)

    def _init_header(self):
        name = self.name.encode()
        fixed = struct.pack("=8s6IQ32s", MAGIC, VERSION, HEADER_SIZE, MEMBER_SIZE, MEMBERS, DEVICES,
                            os.geteuid(), pidns(), name)
        self.mm[0:CRC_BYTES] = fixed
        self._put_u32(CRC_BYTES, zlib.crc32(fixed))

    def _check(self, size):
        head = os.pread(self.fd, HEADER_SIZE, 0)
        if len(head) < HEADER_SIZE or head[:8] != MAGIC:
            raise GroupError("%s is corrupt (no vmmshim group header)" % self.path)
        crc = struct.unpack_from("=I", head, CRC_BYTES)[0]
        if crc != zlib.crc32(head[:CRC_BYTES]):
            raise GroupError("%s is corrupt (header checksum 0x%08x, the header sums to 0x%08x)" %
                             (self.path, crc, zlib.crc32(head[:CRC_BYTES])))
        h = HEADER.unpack(head)
        if h[1] != VERSION:
            raise GroupError("%s has layout version %d, this tool reads version %d (another release made it)" %
                             (self.path, h[1], VERSION))
        if size != SIZE or h[2:6] != (HEADER_SIZE, MEMBER_SIZE, MEMBERS, DEVICES):
            raise GroupError("%s is corrupt (its sizes are not those of version %d)" % (self.path, VERSION))
        if h[6] != os.geteuid() or h[8].rstrip(b"\0").decode("ascii", "replace") != self.name:
            raise GroupError("%s is corrupt (it names uid %d)" % (self.path, h[6]))
        self._map()
        if not h[10]:  # no change cut short: the totals must be the members' sums
            ms = self.members()
            if (sum(m["mapped_all"] for m in ms) != h[32] or sum(m["host_all"] for m in ms) != h[49] or
                    len(ms) != h[53] or any(sum(m["mapped"][d] for m in ms) != h[33 + d] for d in range(DEVICES))):
                raise GroupError("%s is corrupt (its totals are not the sums of its members)" % self.path)

    # ---- reading
    def header(self):
        h = HEADER.unpack_from(self.mm, 0)
        return {
            "version": h[1], "uid": h[6], "pidns": h[7], "name": h[8].rstrip(b"\0").decode(),
            "busy": h[10], "release_seq": h[11], "waiters": h[12], "limit_source": h[13], "limit_gen": h[14],
            "limit_all": h[15], "limit": list(h[16:32]), "total_all": h[32], "total": list(h[33:49]),
            "host_all": h[49], "admitted": h[50], "refused": h[51], "reclaimed": h[52], "members": h[53],
        }

    def members(self):
        out = []
        for i in range(MEMBERS):
            m = MEMBER.unpack_from(self.mm, HEADER_SIZE + i * MEMBER_SIZE)
            if not m[0]:
                continue
            out.append({"slot": i, "pid": m[0], "waiting": m[1] & WAITING, "start": m[2],
                        "comm": m[3].rstrip(b"\0").decode("utf-8", "replace"), "mapped_all": m[4],
                        "host_all": m[5], "mapped": list(m[6:22]), "host": list(m[22:38]),
                        "priority": m[38], "lent": m[40], "borrowed": m[41], "demotions": m[42],
                        "promotions": m[43], "alive": member_alive(m[0], m[2])})
        return out

    def _recount(self):
        ms = self.members()
        self._put_u64(OFF_TOTAL_ALL, sum(m["mapped_all"] for m in ms))
        self._put_u64(OFF_HOST_ALL, sum(m["host_all"] for m in ms))
        for d in range(DEVICES):
            self._put_u64(OFF_TOTALS + 8 * d, sum(m["mapped"][d] for m in ms))
        self._put_u32(OFF_MEMBERS_N, len(ms))
        self._put_u32(OFF_WAITERS, sum(m["waiting"] for m in ms))

    # ---- changing (lock held)
    def set_limit(self, every, per):
        self._put_u32(OFF_BUSY, os.getpid())
        self._put_u64(OFF_LIMIT_ALL, every)
        for d in range(DEVICES):
            self._put_u64(OFF_LIMITS + 8 * d, per[d])
        self._put_u32(OFF_SOURCE, 2)
        self._put_u32(OFF_GEN, self._u32(OFF_GEN) + 1)
        self._put_u32(OFF_SEQ, self._u32(OFF_SEQ) + 1)
        self._put_u32(OFF_BUSY, 0)

    def wake_waiters(self):
        """FUTEX_WAKE on release_seq: members waiting for bytes look at the new limit now."""
        nr = {"x86_64": 202, "aarch64": 98}.get(os.uname().machine)
        if nr is None:
            return False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            word = ctypes.c_uint32.from_buffer(self.mm, OFF_SEQ)
            addr = ctypes.addressof(word)
            libc.syscall(ctypes.c_long(nr), ctypes.c_void_p(addr), ctypes.c_int(1), ctypes.c_int(0x7FFFFFFF),
                         None, None, ctypes.c_int(0))
            del word
            return True
        except (OSError, AttributeError, TypeError, ValueError):
            return False


def limit_text(every, per):
    parts = [human(every) + " every device"] if every else []
    parts += ["device %d: %s" % (d, human(v)) for d, v in enumerate(per) if v]
    return ", ".join(parts) or "none"


def status(name):
    g = Group(name)
    try:
        with g:
            h, ms = g.header(), g.members()
    finally:
        g.close()
    h["path"] = g.path
    h["members_list"] = ms
    return h


def print_status(s):
    print("group %s (%s), layout version %d" % (s["name"], s["path"], s["version"]))
    print("limit: %s (set by %s)" % (limit_text(s["limit_all"], s["limit"]), LIMIT_SOURCES.get(s["limit_source"], "?")))
    line = "mapped: %s every device" % human(s["total_all"])
    devs = ["device %d: %s" % (d, human(v)) for d, v in enumerate(s["total"]) if v]
    if devs:
        line += "; " + ", ".join(devs)
    if s["limit_all"]:
        left = max(s["limit_all"] - s["total_all"], 0)
        line += "; left under the limit: %s" % human(left)
    print(line)
    if s["host_all"]:
        print("served from host memory past the limit: %s" % human(s["host_all"]))
    print("growths admitted %d, refused %d; bytes of dead members returned %s; waiting %d" %
          (s["admitted"], s["refused"], human(s["reclaimed"]), s["waiters"]))
    ms = s["members_list"]
    print("%d member%s" % (len(ms), "" if len(ms) == 1 else "s"))
    if ms:
        print("%8s  %-16s %12s %7s %12s %4s %12s %12s  %s" % ("pid", "name", "mapped", "share", "host", "prio", "lent",
                                                            "borrowed", "state"))
    for m in ms:
        share = 100.0 * m["mapped_all"] / s["total_all"] if s["total_all"] else 0.0
        state = "alive" if m["alive"] else "dead (returned at the next admission)"
        if m["waiting"]:
            state += ", waiting"
        print("%8d  %-16s %12s %6.1f%% %12s %4d %12s %12s  %s" % (
            m["pid"], text.clean(m["comm"]), human(m["mapped_all"]), share, human(m["host_all"]), m["priority"],
            human(m["lent"]), human(m["borrowed"]), state))


def usage(out):
    out.write("usage: vmmshim ctl --group NAME limit SIZE | vmmshim ctl --group NAME status [--json]\n"
              "  SIZE: 8G (every device together), 0:8G,1:4G (per device), 12G,0:8G, or 0/none\n")


def main(argv):
    if len(argv) >= 1 and argv[0] in ("-h", "--help"):
        usage(sys.stdout)
        return 0
    if len(argv) < 2 or argv[1] not in ("limit", "status"):
        usage(sys.stderr)
        return 2
    name, verb = argv[0], argv[1]
    try:
        if verb == "limit":
            if len(argv) != 3:
                usage(sys.stderr)
                return 2
            try:
                every, per = parse_limit(argv[2])
            except ValueError:
                sys.stderr.write("vmmshim: error: '%s' is not a limit (8G, 0:8G,1:4G, 12G,0:8G or none)\n" % argv[2])
                return 2
            g = Group(name, create=True)
            try:
                with g:
                    before = g.header()
                    g.set_limit(every, per)
                g.wake_waiters()
            finally:
                g.close()
            print("group %s: limit %s (was %s); mapped now %s" % (name, limit_text(every, per),
                  limit_text(before["limit_all"], before["limit"]), human(before["total_all"])))
            return 0
        as_json = argv[2:] == ["--json"]
        if argv[2:] and not as_json:
            usage(sys.stderr)
            return 2
        s = status(name)
        if as_json:
            print(json.dumps(s, indent=1, sort_keys=True))
        else:
            print_status(s)
        return 0
    except GroupError as e:
        sys.stderr.write("vmmshim: error: %s\n" % e)
        return 1
    except BrokenPipeError:
        raise  # standard output closed by its reader: cli.main ends quietly
    except OSError as e:
        sys.stderr.write("vmmshim: error: %s\n" % (e.strerror or errno.errorcode.get(e.errno, str(e))))
        return 1


from . import groups  # noqa: E402  (registers the verbs below)

groups.register("limit", lambda group, args: main([group, "limit"] + list(args)), "limit SIZE")
groups.register("status", lambda group, args: main([group, "status"] + list(args)), "status [--json]")
