#!/usr/bin/env python3
"""The floors of src/ (STYLE.md, "The house, floor by floor") are enforced by the build: each floor compiles with
one include root, BUILD/floors/FLOOR/, which holds only the floors it may see (cmake/floors.cmake). Run by ctest
(architecture.floors), this checks that the enforcement holds, with the build's own compile commands
(BUILD/compile_commands.json):

- every folder of src/ that this build compiles is a floor with an include root, and each of its sources
  compiles with that root;
- for each floor, an #include of a header of every floor it does not see, and of every public header
  (include/qkv/) it does not see, fails to compile with the command of one of the floor's sources, with the
  compiler's "No such file" for that header; a header of its own floor and of core compiles;
- no quoted #include in src/ or include/qkv/ climbs with "..", the one way around an include root.

    python3 tools/check_floors.py ROOT BUILD

Prints each problem and exits 1 if there is one, 0 otherwise.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile


def first_header(folder):
    """The first header (sorted) under folder, as a path from its parent: 'core/fork_gate.hpp'."""
    for dirpath, dirs, files in sorted(os.walk(folder)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".hpp"):
                return os.path.relpath(os.path.join(dirpath, name), os.path.dirname(folder))
    return None


def compile_probe(command, directory, include, workdir):
    """Compiles a file holding only `#include "include"` with command (a source's compile command), syntax
    only. Returns (ok, compiler output)."""
    probe = os.path.join(workdir, "probe.cpp")
    with open(probe, "w", encoding="utf-8") as f:
        f.write(f'#include "{include}"\n')
    args = shlex.split(command)
    if os.path.basename(args[0]) == "ccache":  # compile directly: a probe is not worth caching
        args = args[1:]
    flags = []
    skip = False
    for a in args[1:]:  # the source's flags, less its output, dependency file and the source itself
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
        elif a not in ("-c", "-MD", "-MMD") and not a.endswith((".cpp", ".cc")):
            flags.append(a)
    run = subprocess.run(args[:1] + flags + ["-fsyntax-only", probe], cwd=directory, capture_output=True, text=True)
    return run.returncode == 0, run.stdout + run.stderr


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    root, build = (os.path.abspath(a) for a in sys.argv[1:])
    src = os.path.join(root, "src")
    floors_dir = os.path.join(build, "floors")
    bad = []

    floors = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    public = sorted(f for f in os.listdir(os.path.join(root, "include", "qkv")) if f.endswith(".hpp"))
    commands = json.load(open(os.path.join(build, "compile_commands.json"), encoding="utf-8"))

    with tempfile.TemporaryDirectory() as workdir:
        for floor in floors:
            inc_root = os.path.join(floors_dir, floor)
            own = [c for c in commands if c["file"].startswith(os.path.join(src, floor) + os.sep)]
            if not own:  # not built in this configuration (QKV_BUILD_CLI=OFF)
                print(f"src/{floor}/: not built here")
                continue
            if not os.path.isdir(inc_root):
                bad.append(f"src/{floor}/ is on no floor: no include root {inc_root} (cmake/floors.cmake)")
                continue
            sees = sorted(d for d in os.listdir(inc_root) if d != "qkv")
            sees_public = sorted(os.listdir(os.path.join(inc_root, "qkv")))
            for c in own:
                cmd = c.get("command") or shlex.join(c["arguments"])
                if f"-I{inc_root}" not in shlex.split(cmd):
                    bad.append(f"{os.path.relpath(c['file'], root)} does not compile with its floor's include root")
            cmd = own[0].get("command") or shlex.join(own[0]["arguments"])
            where = own[0]["directory"]
            probes = [(first_header(os.path.join(src, f)), False) for f in floors if f not in sees]
            probes += [(f"qkv/{h}", False) for h in public if h not in sees_public]
            probes += [(first_header(os.path.join(src, f)), True) for f in sorted({floor, "core"})]
            for header, visible in probes:
                ok, text = compile_probe(cmd, where, header, workdir)
                if visible and not ok:
                    bad.append(f"floor {floor}: #include \"{header}\" should compile and does not:\n{text}")
                elif not visible and ok:
                    bad.append(f"floor {floor}: #include \"{header}\" compiles, but {floor} does not see that floor")
                elif not visible and not re.search(re.escape(header) + r":? No such file", text):
                    bad.append(f"floor {floor}: #include \"{header}\" fails, but not for want of the header:\n{text}")

    for base in ("src", os.path.join("include", "qkv")):
        for dirpath, _, files in os.walk(os.path.join(root, base)):
            for name in files:
                if not name.endswith((".hpp", ".cpp", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                for n, line in enumerate(open(path, encoding="utf-8"), 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if m and ".." in m.group(1).split("/"):
                        bad.append(f"{os.path.relpath(path, root)}:{n}: includes {m.group(1)}, around the include root")
    for b in bad:
        print(b)
    print(f"check_floors: {len(floors)} floors, {len(bad)} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
