#!/usr/bin/env python3
"""An independent kvd client written from shared/protocols/kvd.md §8.3-8.4
(Debian's python3-msgpack only). It exercises hello + arena fd passing +
mmap, set/get, batch get/set, reserve -> write into the arena -> commit,
zero-copy reads through get_shared_response with the slot-header check,
exists, stats and clear, and exits non-zero on the first mismatch.

usage: kvd_client.py SOCKET_PATH
"""
import array
import mmap
import socket
import struct
import sys

import msgpack

MODEL, COMPAT = "py-model", "tp0of1"


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                fail("connection closed")
            buf += chunk
        return buf

    def send(self, op, **fields):
        body = msgpack.packb({"op": op, **fields}, use_bin_type=True)
        self.s.sendall(struct.pack(">I", len(body)) + body)

    def recv(self):
        (n,) = struct.unpack(">I", self.recv_exact(4))
        return msgpack.unpackb(self.recv_exact(n), raw=False)

    def call(self, op, want, **fields):
        self.send(op, **fields)
        msg = self.recv()
        check(msg.get("op") in want, f"{op}: got {msg}")
        return msg

    def recv_fd(self):
        fds = array.array("i")
        data, anc, _flags, _addr = self.s.recvmsg(1, socket.CMSG_SPACE(fds.itemsize))
        check(data == b"F", f"fd marker {data!r}")
        for level, typ, payload in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        check(len(fds) == 1, f"want one fd, got {list(fds)}")
        return fds[0]


def read_shared(mm, off, length, version):
    """Seqlock read: version even and equal to the wire's, payload, version
    again; up to 3 tries."""
    for _ in range(3):
        v1, hlen = struct.unpack_from("<II", mm, off - 16)
        if v1 % 2 or v1 != version or hlen != length:
            continue
        data = bytes(mm[off : off + length])
        (v2,) = struct.unpack_from("<I", mm, off - 16)
        if v2 == v1:
            return data
    return None


def val(i, n):
    return bytes((i * 7 + j) % 251 for j in range(n))


def ns(**kw):
    return dict(model=MODEL, compat_key=COMPAT, **kw)


def main(path):
    c = Conn(path)
    ack = c.call("hello", {"hello_ack"}, client_id="py-test", protocol_version=1, prefers_shared_arena=True)
    check(ack["protocol_version"] == 1 and ack["server_id"].startswith("kvd-"), f"hello_ack {ack}")
    check(ack["shared_arena"] is not None, "no arena offered")
    arena_size, _slot_size, server_pid = ack["shared_arena"]
    check(server_pid > 0, "server pid")
    fd = c.recv_fd()
    mm = mmap.mmap(fd, arena_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)

    # set / get (zero-copy through the arena)
    k1, v1 = b"\x00" * 7 + b"\x01", val(1, 3000)
    r = c.call("set", {"set_ack"}, key=k1, value=v1, retention="short", metadata={"layers": 2}, ttl_seconds=None, **ns())
    check(r["accepted"] is True, f"set {r}")
    r = c.call("get", {"get_shared_response"}, key=k1, **ns())
    check(r["length"] == len(v1) and r["version"] % 2 == 0 and r["retention"] == "short", f"get_shared {r}")
    check(r["slot_size"] >= len(v1) + 16 and r["slot_size"] % 64 == 0, f"slot_size {r}")
    check((r["slot_offset"] - 16) % 64 == 0, "payload offset is a 64-aligned slot start + 16")
    check(read_shared(mm, r["slot_offset"], r["length"], r["version"]) == v1, "zero-copy bytes differ")
    slot_size = r["slot_size"]
    miss = c.call("get", {"get_response"}, key=b"nokey---", **ns())
    check(miss["value"] is None, f"miss {miss}")

    # batch set / batch get
    keys = [bytes([0, 0, 0, 0, 0, 0, 1, i]) for i in range(3)]
    vals = [val(10 + i, 2000) for i in range(3)]
    r = c.call("batch_set", {"batch_set_ack"}, keys=keys, values=vals, retentions=["long", "short", "ephemeral"],
               metadatas=[{}, {}, {}], ttls_seconds=None, **ns())
    check(r["accepted"] == [True, True, True], f"batch_set {r}")
    r = c.call("batch_get", {"batch_get_shared_response"}, keys=keys + [b"missing!"], **ns())
    check(r["offsets"][3] == -1 and r["lengths"][3] == 0, f"batch miss {r}")
    for i in range(3):
        got = read_shared(mm, r["offsets"][i], r["lengths"][i], r["versions"][i])
        check(got == vals[i], f"batch value {i}")
    check(r["retentions"][:3] == ["long", "short", "ephemeral"], f"retentions {r['retentions']}")
    r = c.call("batch_set", {"error"}, keys=keys, values=vals[:2], retentions=["short"] * 3, metadatas=[{}] * 3, **ns())
    check(r["code"] == "batch_set_arity_mismatch", f"arity {r}")

    # reserve -> write into the arena -> commit
    k2, v2 = b"lease-k2", val(2, 1500)
    r = c.call("set_reserve", {"set_reserve_response"}, size=len(v2))
    check(r["lease_token"] != 0 and r["reason"] == "" and r["payload_max_size"] >= len(v2)
          and (r["payload_max_size"] + 16) % 64 == 0 and slot_size >= 64, f"reserve {r}")
    (ver,) = struct.unpack_from("<I", mm, r["payload_offset"] - 16)
    check(ver % 2 == 1, "a leased slot reads as being written")
    mm[r["payload_offset"] : r["payload_offset"] + len(v2)] = v2
    r = c.call("set_commit", {"set_commit_response"}, lease_token=r["lease_token"], key=k2, length=len(v2),
               retention="long", ttl_seconds=0, **ns())
    check(r["accepted"] is True and r["reason"] == "", f"commit {r}")
    r = c.call("get", {"get_shared_response"}, key=k2, **ns())
    check(read_shared(mm, r["slot_offset"], r["length"], r["version"]) == v2, "committed bytes differ")
    check(r["retention"] == "long", "commit retention")
    r = c.call("set_reserve", {"set_reserve_response"}, size=100)
    c.call("set_cancel", {"set_cancel_response"}, lease_token=r["lease_token"])
    c.call("set_cancel", {"set_cancel_response"}, lease_token=r["lease_token"])
    r = c.call("set_commit", {"set_commit_response"}, lease_token=r["lease_token"], key=b"k", length=1, **ns())
    check(r["accepted"] is False, "commit of a cancelled lease")

    # a stale (offset, version) pair is detected after an overwrite
    old = c.call("get", {"get_shared_response"}, key=k1, **ns())
    c.call("set", {"set_ack"}, key=k1, value=val(3, 3000), retention="short", metadata={}, ttl_seconds=None, **ns())
    c.call("set", {"set_ack"}, key=b"filler!!", value=val(4, 3000), retention="short", metadata={}, ttl_seconds=None, **ns())
    new = c.call("get", {"get_shared_response"}, key=k1, **ns())
    check(read_shared(mm, new["slot_offset"], new["length"], new["version"]) == val(3, 3000), "overwrite")
    if new["slot_offset"] == old["slot_offset"]:
        check(new["version"] != old["version"], "reused slot kept its version")

    # exists, prefetch_hint (no reply), stats, clear
    r = c.call("exists", {"exists_response"}, keys=[k1, b"missing!", k2], **ns())
    check(r["present"] == [True, False, True], f"exists {r}")
    c.send("prefetch_hint", keys=[b"missing!"], deadline_ms=100, **ns())
    r = c.call("stats", {"stats_response"})
    for f in ("entries", "host_bytes", "spillover_bytes", "long_bytes", "gets_total", "sets_total",
              "hits_total", "misses_total", "evictions_total"):
        check(isinstance(r.get(f), int), f"stats field {f}: {r}")
    check(r["entries"] == 6, f"entries {r}")
    r = c.call("clear", {"clear_ack"}, model=MODEL, compat_key=COMPAT)
    check(r["cleared_entries"] == 6, f"clear {r}")
    r = c.call("stats", {"stats_response"})
    check(r["entries"] == 0 and r["host_bytes"] == 0, f"stats after clear {r}")

    # no-hello mode on a second connection: inline values
    c2 = Conn(path)
    r = c2.call("set", {"set_ack"}, key=k1, value=b"inline", retention="short", metadata={}, ttl_seconds=None, **ns())
    check(r["accepted"], "no-hello set")
    r = c2.call("get", {"get_response"}, key=k1, **ns())
    check(r["value"] == b"inline", f"no-hello get {r}")
    r = c2.call("bogus_op", {"error"})
    check(r["code"] == "bad_op", f"bad op {r}")
    mm.close()
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
