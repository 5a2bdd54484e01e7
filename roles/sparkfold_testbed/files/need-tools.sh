#!/bin/sh
# What the control host runs to build and boot the testbed and to make the venv, and the Debian
# package of each (.ci/run installs the same). Prints nothing and exits 0 when all are there. Else,
# without --install (the testbed role's first task): one line naming the apt-get line that installs
# what is missing, exit 1. With --install (`make demo`, first, before its venv): as root, it prints
# that apt-get line and runs it, then looks again.
lacking() {
    found=""
    for pair in debootstrap:debootstrap systemd-nspawn:systemd-container rsync:rsync ssh:openssh-client \
            ssh-keygen:openssh-client ip:iproute2 dpkg-scanpackages:dpkg-dev \
            docker-registry:docker-registry git:git; do
        tool=${pair%%:*} package=${pair#*:}
        command -v "$tool" >/dev/null 2>&1 && continue
        case " $found " in *" $package "*) ;; *) found="${found:+$found }$package" ;; esac
    done
    # make venv: Debian's python3 makes venvs only with python3-venv (ensurepip)
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || found="${found:+$found }python3-venv"
    echo "$found"
}
missing=$(lacking)
if [ -n "$missing" ] && [ "$1" = --install ] && [ "$(id -u)" = 0 ]; then
    echo "installing what the testbed needs on this host: apt-get install -y $missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing \
        || { echo "apt-get could not install $missing: install them, then run make demo again"; exit 1; }
    missing=$(lacking)
fi
if [ -n "$missing" ]; then
    echo "the testbed needs $missing on this host (not on PATH): sudo apt-get install -y $missing"
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "the testbed runs as root (network namespaces, systemd-nspawn): sudo make demo"
    exit 1
fi
