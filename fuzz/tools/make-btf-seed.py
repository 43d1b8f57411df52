#!/usr/bin/env python3
"""Writes a small raw BTF blob (the format of /sys/kernel/btf/vmlinux, described in the
kernel's Documentation/bpf/btf.rst) with the structs and members qosd reads offsets of, as
the btf fuzz target's seed: the fuzzer starts from a blob whose lookups succeed.

Usage: make-btf-seed.py OUT"""
import struct
import sys

KIND_INT, KIND_PTR, KIND_STRUCT, KIND_ENUM = 1, 2, 4, 6
strings = bytearray(b"\0")
types = bytearray()
next_id = 1


def name(text):
    offset = len(strings)
    strings.extend(text.encode() + b"\0")
    return offset


def add(kind, type_name, vlen, size_or_type, tail=b""):
    global next_id
    types.extend(struct.pack("<III", name(type_name) if type_name else 0,
                             (kind << 24) | vlen, size_or_type))
    types.extend(tail)
    next_id += 1
    return next_id - 1


def integer(type_name, bits):
    return add(KIND_INT, type_name, 0, bits // 8, struct.pack("<I", bits))


def pointer(target):
    return add(KIND_PTR, None, 0, target)


def structure(type_name, size, members):
    tail = b"".join(struct.pack("<III", name(m), t, off * 8) for m, t, off in members)
    return add(KIND_STRUCT, type_name, len(members), size, tail)


def enum(type_name, values):
    tail = b"".join(struct.pack("<Ii", name(n), v) for n, v in values)
    return add(KIND_ENUM, type_name, len(values), 4, tail)


u32 = integer("unsigned int", 32)
u64 = integer("long long unsigned int", 64)
void_ptr = pointer(0)
thread_info = structure("thread_info", 24, [("flags", u64, 0), ("cpu", u32, 16)])
sched_entity = structure("sched_entity", 64, [("sum_exec_runtime", u64, 8),
                                              ("prev_sum_exec_runtime", u64, 16)])
sched_info = structure("sched_info", 32, [("pcount", u64, 0), ("run_delay", u64, 8)])
kernfs_node = structure("kernfs_node", 16, [("id", u64, 8)])
cgroup = structure("cgroup", 32, [("kn", pointer(kernfs_node), 24)])
css = structure("cgroup_subsys_state", 16, [("cgroup", pointer(cgroup), 0)])
css_set = structure("css_set", 128, [("subsys", void_ptr, 8), ("dfl_cgrp", pointer(cgroup), 120)])
structure("task_struct", 512, [("thread_info", thread_info, 0), ("__state", u32, 24),
                               ("se", sched_entity, 64), ("policy", u32, 160),
                               ("sched_info", sched_info, 192), ("pid", u32, 256),
                               ("cgroups", pointer(css_set), 320)])
task_group = structure("task_group", 64, [("css", css, 0)])
structure("cfs_rq", 256, [("tg", pointer(task_group), 200), ("throttled", u32, 240)])
enum("cgroup_subsys_id", [("cpuset_cgrp_id", 0), ("cpu_cgrp_id", 1), ("cpuacct_cgrp_id", 2)])

header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
with open(sys.argv[1], "wb") as out:
    out.write(header + bytes(types) + bytes(strings))
