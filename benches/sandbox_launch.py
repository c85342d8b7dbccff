"""What the sandbox adds to starting a command tool (issue 40): starts /bin/true N
times directly, then N times through `toolgate sandbox-exec` under the default
profile (Landlock, seccomp, rlimits, namespaces where allowed, uid drop when root),
and prints the median and p95 of each and their difference, in milliseconds.

    python3 benches/sandbox_launch.py target/release/toolgate [N]

Not a test: it measures this machine. docs/performance.md, "Sandbox", has the figure.
"""
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time

toolgate = os.path.abspath(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
root = os.geteuid() == 0
spec = {
    "program": "/bin/true",
    "argv": ["true"],
    "working_dir": "/",
    "read": ["/etc/ld.so.cache"],
    "exec": ["/usr/lib", "/usr/bin/true"],
    "write": ["/dev/null"],
    "network": "none",
    "limits": {"cpu_s": 30, "memory_mb": 2048, "processes": 64, "open_files": 256, "file_size_mb": 64},
    "run_as": [65534, 65534] if root else None,
    "namespaces": "--no-namespaces" not in sys.argv,
    "landlock_missing": False,
}
env = {"TOOLGATE_SANDBOX_SPEC": json.dumps(spec)}


def run(argv, sandboxed):
    times = []
    for _ in range(n):
        r0, w0 = os.pipe()
        r = fcntl.fcntl(r0, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(r0)
        os.dup2(w0, 3)
        os.close(w0)
        start = time.perf_counter()
        p = subprocess.Popen(argv, env=env if sandboxed else {}, pass_fds=(3,) if sandboxed else ())
        os.close(3)
        p.wait()
        elapsed = time.perf_counter() - start
        report = os.read(r, 65536)
        os.close(r)
        if sandboxed and b'"started"' not in report:
            sys.exit("the launcher did not start the tool: %r" % report)
        times.append(elapsed * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95)]


direct = run(["/bin/true"], False)
confined = run([toolgate, "sandbox-exec"], True)
print("direct:    median %.2f ms, p95 %.2f ms" % direct)
print("sandboxed: median %.2f ms, p95 %.2f ms" % confined)
print("added:     median %.2f ms" % (confined[0] - direct[0]))
