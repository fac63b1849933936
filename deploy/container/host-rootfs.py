#!/usr/bin/env python3
"""Lists the files of a minimal Debian root filesystem made from this machine's installed packages.

Usage: host-rootfs.py [EXTRA_PACKAGE ...] > filelist

The packages are Debian's "required" and "Essential: yes" ones plus EXTRA_PACKAGEs, closed over
Pre-Depends and Depends (the first installed alternative), which is what `debootstrap
--variant=minbase` installs and what the debian:*-slim images hold. Paths are printed relative to /
with directories resolved through the merged-/usr symlinks (/bin -> usr/bin, ...), one per line, for
`tar --no-recursion -C / -T filelist`. Used by build-local.sh to stand in for base images this
machine cannot pull.
"""
import os
import subprocess
import sys


def installed():
    fmt = "${Package}\t${Priority}\t${Essential}\t${Pre-Depends}, ${Depends}\t${Provides}\n"
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=" + fmt], capture_output=True, text=True, check=True
    ).stdout
    packages, provides = {}, {}
    for line in out.splitlines():
        name, priority, essential, depends, provided = line.split("\t")
        packages[name] = (priority, essential, depends)
        for p in provided.split(","):
            p = p.strip().split(" ")[0]
            if p:
                provides.setdefault(p, name)
    return packages, provides


def closure(roots, packages, provides):
    seen, stack = set(), list(roots)
    while stack:
        name = stack.pop().split(":")[0]
        if name not in packages:
            name = provides.get(name)
            if name is None:
                continue
        if name in seen:
            continue
        seen.add(name)
        for alternatives in packages[name][2].split(","):
            for alt in alternatives.split("|"):
                alt = alt.strip().split(" ")[0].split(":")[0]
                if alt in packages or alt in provides:
                    stack.append(alt)
                    break
    return seen


def main():
    packages, provides = installed()
    missing = [p for p in sys.argv[1:] if p not in packages and p not in provides]
    if missing:
        sys.exit("not installed on this machine: " + " ".join(missing))
    roots = [n for n, (prio, ess, _) in packages.items() if prio == "required" or ess == "yes"]
    chosen = closure(roots + sys.argv[1:], packages, provides)
    files = set()
    for name in sorted(chosen):
        listed = subprocess.run(
            ["dpkg", "-L", name], capture_output=True, text=True, check=True
        ).stdout
        for path in listed.splitlines():
            if not path.startswith("/") or path == "/." or not os.path.lexists(path):
                continue
            parent = os.path.realpath(os.path.dirname(path))
            real = os.path.join(parent, os.path.basename(path))
            if os.path.lexists(real):
                files.add(real.lstrip("/"))
    # Symlinks that postinst scripts make with update-alternatives (cc -> gcc, ...), for the files
    # chosen.
    for directory in ("/usr/bin", "/usr/sbin"):
        for name in os.listdir(directory):
            link = os.path.join(directory, name)
            if not os.path.islink(link):
                continue
            target = os.readlink(link)
            if not target.startswith("/etc/alternatives/"):
                continue
            if os.path.realpath(link).lstrip("/") in files:
                files.add(link.lstrip("/"))
                files.add(target.lstrip("/"))
    for path in sorted(files):
        print(path)
    print(f"{len(chosen)} packages, {len(files)} paths", file=sys.stderr)


if __name__ == "__main__":
    main()
