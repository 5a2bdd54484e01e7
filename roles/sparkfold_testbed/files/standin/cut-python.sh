#!/bin/bash
# Cut a Python 3 runtime out of the testbed's node rootfs, as a tarball for a FROM scratch image:
# the interpreter, its standard library and the shared libraries they load (found with the
# rootfs's own ldd, so versions match the nodes'). Deterministic (sorted, mtime 0, owner root),
# so the stand-in image's series hash stays the same while the rootfs does.
#   cut-python.sh ROOTFS OUT.tar
set -euo pipefail
rootfs=$(readlink -f "$1") out=$2
python=$(readlink -f "$rootfs/usr/bin/python3")
python=${python#"$rootfs"}
stdlib=/usr/lib/$(basename "$python")
list=$(mktemp)
trap 'rm -f "$list"' EXIT
{
  echo "${python#/}"
  echo usr/bin/python3
  (cd "$rootfs" && find "${stdlib#/}" \( -name test -o -name tests -o -name idlelib -o -name tkinter \
      -o -name __pycache__ -o -name ensurepip \) -prune -o \( -type f -o -type l \) -print)
  for binary in "$python" $(cd "$rootfs" && find "${stdlib#/}/lib-dynload" -name '*.so' -printf '/%p\n'); do
    chroot "$rootfs" ldd "$binary" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}'
  done | sort -u | while read -r lib; do
    # Both the name the loader asks for and the file it points to, under usr/ (merged /usr:
    # /lib and /lib64 are links to usr/lib and usr/lib64).
    for path in "$lib" "$(chroot "$rootfs" readlink -f "$lib")"; do
      echo "usr${path#/usr}"
    done
  done
  echo lib
  echo lib64
  echo bin
} | sed 's|^/||' | LC_ALL=C sort -u > "$list"
tar -C "$rootfs" --no-recursion --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
  -cf "$out.partial" -T "$list"
mv "$out.partial" "$out"
