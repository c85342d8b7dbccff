#!/usr/bin/env python3
"""Flamegraph and per-step CPU breakdown of a `perf record -g` profile (issue 19).

Usage:
    perf script -i perf.data > perf.txt
    python3 docs/perf/flamegraph.py perf.txt --svg out.svg --title "..." [--folded out.folded]

Reads the text of `perf script` (one block per sample: a header line with the thread
name, then one frame per line, leaf first), folds the stacks, prints the share of
samples per thread and per step of the gated call (each sample goes to the innermost
frame that belongs to a step; allocator and memcpy leaves are counted apart as well),
and writes a self-contained SVG flamegraph (no JavaScript; hover titles give the
counts). Python 3 standard library only.
"""

import argparse
import collections
import html
import re
import sys

# The steps of a gated call, matched against demangled frame names, innermost first.
# Order matters only when two patterns match the same frame.
STEPS = [
    ("signing (ed25519)", re.compile(r"ed25519|ED25519|curve25519|edwards25519|Checkpoint.*sign|sign_head")),
    ("SQLite writer", re.compile(r"sqlite3|rusqlite|write_batch|audit::store")),
    ("audit line: canonical JSON + hashing", re.compile(
        r"canonical|audit::line|merkle|leaf_hash|sha2::|Sha256|hmac|commit_arguments|write_portable")),
    ("schema validation", re.compile(r"jsonschema|referencing::|fancy_regex|regex")),
    ("conditions (CEL)", re.compile(r"\bcel::|cel_interpreter|condition")),
    ("JSON parse", re.compile(r"serde_json::de|from_slice|from_str|CallBody|Deserialize")),
    ("JSON serialize (response, events, details)", re.compile(
        r"serde_json::ser|to_vec|to_value|Serialize|serde_json::value::ser")),
    ("logging / metrics / tracing", re.compile(
        r"tracing|log_call|prometheus|metrics|observe::|fmt::format|tracing_subscriber")),
    ("tool (case_lookup, file read)", re.compile(r"adapter::|builtin|open_beneath|read_bounded")),
    ("pipeline (decision, events, response)", re.compile(
        r"pipeline|authz|gateway::|call::|idempotency|runs::|Call::event|policy::")),
    ("HTTP (hyper)", re.compile(r"hyper|http_body|h1::|transport::|server::route")),
    ("tokio hand-offs (scheduler, wakeups, channels)", re.compile(
        r"tokio::runtime|tokio::sync|oneshot|mpsc|park|unpark|wake|futex|blocking::pool|spawn_blocking")),
    ("kernel: network", re.compile(r"tcp_|inet_|sock_|__sys_sendto|__sys_recvfrom|ip_|net_rx|loopback|skb")),
    ("kernel: scheduler", re.compile(r"schedule|finish_task_switch|__switch_to|try_to_wake_up|pick_next")),
    ("kernel: file I/O", re.compile(r"ext4|vfs_|jbd2|fsync|pwrite|pread|filemap|blk_|do_sys_open|openat")),
    ("kernel: epoll / syscalls", re.compile(r"epoll|syscall|entry_SYSCALL|do_syscall|__x64_sys")),
]
ALLOC = re.compile(r"^(mi_|_mi_|malloc|free|realloc|calloc|__libc_malloc|cfree|memcpy|memmove|__memcpy|__memmove|alloc::alloc|__rust_alloc|__rust_dealloc|__rdl_)")

HEADER = re.compile(r"^(\S.*?)\s+(\d+)(?:/(\d+))?\s+")
FRAME = re.compile(r"^\s+[0-9a-f]+\s+(.+?)(?:\s+\(([^)]*)\))?$")


def clean(name):
    """Shortens a demangled Rust symbol: no hash suffix, no offset."""
    name = re.sub(r"\+0x[0-9a-f]+$", "", name)
    name = re.sub(r"::h[0-9a-f]{16}$", "", name)
    return name


def read_samples(lines):
    """Yields (thread name, [frames leaf first])."""
    thread, frames = None, []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if thread is not None:
                yield thread, frames
            thread, frames = None, []
            continue
        if not line[0].isspace():
            m = HEADER.match(line)
            thread = m.group(1) if m else line.split()[0]
            frames = []
            continue
        m = FRAME.match(line)
        if m:
            frames.append(clean(m.group(1)))
    if thread is not None:
        yield thread, frames


def step_of(frames):
    for frame in frames:
        for name, pattern in STEPS:
            if pattern.search(frame):
                return name
    return "other"


def thread_group(thread):
    if thread.startswith(("tokio-runtime", "tokio-rt", "toolgate-http")):
        return "tokio workers"
    return thread


def svg(folded, total, title, width=1200, frame_h=16, min_width=1.0):
    """A flamegraph: root at the bottom, children sorted by name, width by samples."""
    tree = {"n": 0, "c": {}}
    for stack, count in folded.items():
        node = tree
        node["n"] += count
        for frame in stack:
            node = node["c"].setdefault(frame, {"n": 0, "c": {}})
            node["n"] += count
    depth = [0]

    def measure(node, d):
        depth[0] = max(depth[0], d)
        for child in node["c"].values():
            measure(child, d + 1)

    measure(tree, 0)
    height = (depth[0] + 3) * frame_h + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="14">{html.escape(title)}</text>',
    ]
    scale = (width - 20) / max(tree["n"], 1)

    def color(name):
        h = sum(ord(c) for c in name) % 60
        return f"rgb({205 + h % 50},{80 + h * 2},{40 + h % 30})"

    def draw(node, name, x, d):
        w = node["n"] * scale
        if w < min_width:
            return
        y = height - (d + 1) * frame_h - 5
        pct = 100.0 * node["n"] / max(total, 1)
        label = html.escape(name)
        out.append(
            f'<g><title>{label} ({node["n"]} samples, {pct:.2f}%)</title>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{frame_h - 1}" fill="{color(name)}"/>'
        )
        chars = int(w / 7)
        if chars >= 3:
            text = name if len(name) <= chars else name[: chars - 2] + ".."
            out.append(f'<text x="{x + 2:.1f}" y="{y + frame_h - 4}">{html.escape(text)}</text>')
        out.append("</g>")
        cx = x
        for child_name in sorted(node["c"]):
            child = node["c"][child_name]
            draw(child, child_name, cx, d + 1)
            cx += child["n"] * scale

    draw(tree, "all", 10, 0)
    out.append("</svg>")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("perf_script")
    parser.add_argument("--svg")
    parser.add_argument("--folded")
    parser.add_argument("--title", default="toolgate gated call")
    parser.add_argument("--max-depth", type=int, default=40,
                        help="frames kept per stack, from the root (keeps the SVG small)")
    parser.add_argument("--min-width", type=float, default=1.5,
                        help="frames narrower than this many pixels are left out (file size)")
    args = parser.parse_args()
    with open(args.perf_script, errors="replace") as f:
        samples = list(read_samples(f))
    total = len(samples)
    if total == 0:
        sys.exit("no samples")
    by_thread = collections.Counter()
    by_step = collections.Counter()
    by_step_thread = collections.Counter()
    alloc = 0
    folded = collections.Counter()
    for thread, frames in samples:
        group = thread_group(thread)
        by_thread[group] += 1
        step = step_of(frames)
        by_step[step] += 1
        by_step_thread[(group, step)] += 1
        if frames and ALLOC.search(frames[0]):
            alloc += 1
        stack = [group] + list(reversed(frames))[: args.max_depth]
        folded[tuple(stack)] += 1
    print(f"samples: {total}")
    print("\nby thread:")
    for name, n in by_thread.most_common():
        print(f"  {100.0 * n / total:5.1f}%  {name}")
    print("\nby step (innermost matching frame):")
    for name, n in by_step.most_common():
        print(f"  {100.0 * n / total:5.1f}%  {name}")
    print(f"\nallocator / memcpy leaves (across steps): {100.0 * alloc / total:.1f}%")
    print("\nby thread and step (top 25):")
    for (group, step), n in by_step_thread.most_common(25):
        print(f"  {100.0 * n / total:5.1f}%  {group:<16} {step}")
    if args.folded:
        with open(args.folded, "w") as f:
            for stack, n in folded.items():
                f.write(";".join(stack) + f" {n}\n")
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(folded, total, args.title, min_width=args.min_width))


if __name__ == "__main__":
    main()
