#!/bin/sh
# What the control host runs to build and boot the testbed, and the Debian package of each (.ci/run
# installs the same). Prints nothing and exits 0 when all are there; else one line naming the
# apt-get line that installs what is missing, and exits 1. Run by `make demo` before anything else
# (a fresh host has no venv yet) and by the testbed role's first task.
lacking=""
for pair in debootstrap:debootstrap systemd-nspawn:systemd-container rsync:rsync ssh:openssh-client \
        ssh-keygen:openssh-client ip:iproute2 dpkg-scanpackages:dpkg-dev \
        docker-registry:docker-registry; do
    tool=${pair%%:*} package=${pair#*:}
    command -v "$tool" >/dev/null 2>&1 && continue
    case " $lacking " in *" $package "*) ;; *) lacking="${lacking:+$lacking }$package" ;; esac
done
if [ -n "$lacking" ]; then
    echo "the testbed needs $lacking on this host (not on PATH): sudo apt-get install -y $lacking"
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "the testbed runs as root (network namespaces, systemd-nspawn): sudo make demo"
    exit 1
fi
