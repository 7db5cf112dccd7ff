#!/usr/bin/env bash
# Proves `ray up cluster.yaml` (Ray's local provider) end to end on this one machine, over loopback only:
#   node = a throwaway Unix user: its own home, venv (your Ray version), Ray temp dir and free Ray ports
#   ssh  = our own sshd on 127.0.0.1:<free port> and a throwaway key (nothing in /etc/ssh is used or changed)
#   yaml = a temp copy of the shipped cluster.yaml, head_ip / ssh_user / key overridden, the shipped head start
#          command run on free ports and a loopback address of its own
# `ray up -y`; `ray exec` of `waferrt generate --address auto --json` and of `--reference --json` (same prompt,
# greedy) must give equal tokens; `ray down -y`. All it started is removed on success and failure (trap).
# It never touches a Ray it did not start: the shipped start commands have no `ray stop` (checked), its Ray
# listens on ports nobody else had bound, and every Ray command on the node (the `ray stop` that `ray down`
# runs too) runs as the throwaway user, whose `ray stop` can only signal that user's processes (others' fail
# with EPERM); the node's RAY_TMPDIR is its own, so `--address auto` there finds this cluster only.
# Needs root (apt-get, useradd, sshd) and `ray` + PyYAML on PATH. Usage:
#   bash examples/cluster/try_ray_up.sh     # env: PROMPT, TOKENS; KEEP_LOGS=DIR keeps ray up/exec/down's logs
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PROMPT=${PROMPT:-"The capital of France is"}
TOKENS=${TOKENS:-8}
NODE_USER=wrtup$$                 # one user per run: two runs never share a user, a Ray or a port
CLUSTER=waferrt-tryup-$$          # ray up keeps per-cluster state (lock, ssh control socket) by name
WORK="" SSHD_PID="" MADE_USER="" MADE_PRIVSEP="" MADE_POLICY="" CLUSTER_UP="" CONTROL_PARENT="" KEEP_PARENT=""
RAYLETS_BEFORE="" CHILD=""

exec 3>&2   # the terminal's stderr for log(): a trap may run inside a command whose stderr goes to a file
log() { printf '[try_ray_up %(%T)T] %s\n' -1 "$*" >&3; }
die() { log "FAILED: $*"; exit 1; }

wait_for() {  # wait_for SECONDS CMD...: poll CMD until it succeeds, at most SECONDS
    local end=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || return 1
        sleep 0.5
    done
}

free_port() {  # the first port >= $1 that nothing on this machine has bound (any address)
    local p=$1
    until python3 -c 'import socket, sys; socket.socket().bind(("", int(sys.argv[1])))' "$p" 2>/dev/null; do
        p=$((p + 1))
    done
    echo "$p"
}

run() {  # run SECONDS CMD...: under a timeout, waited for in the background so Ctrl-C/TERM trap at once
    timeout -k 10 "$1" "${@:2}" 3>&- & CHILD=$!   # timeout makes its own process group: cleanup can end all of it
    local rc=0; wait "$CHILD" || rc=$?
    CHILD=""; return "$rc"
}
as_node() { run "$1" su - "$NODE_USER" -c "$2"; }   # as_node SECONDS 'CMD': a login shell of the node user
# `ray` on the laptop side: its state, config cache and logs go to our temp dir (TMPDIR), not /tmp/ray
ray_cli() { run "$1" env TMPDIR="$WORK/tmp" RAY_USAGE_STATS_ENABLED=0 ray "${@:2}"; }

install_packages() {  # ssh + rsync for `ray up`, nc to reach a non-22 ssh port, venv for the node's Python
    local missing=()
    [[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
    command -v ssh >/dev/null || missing+=(openssh-client)
    command -v rsync >/dev/null || missing+=(rsync)
    command -v nc >/dev/null || missing+=(netcat-openbsd)
    /usr/bin/python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
    ((${#missing[@]})) || return 0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then  # the package must not start a system sshd on port 22
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && MADE_POLICY=1
    fi
    log "apt-get install ${missing[*]}"
    run 600 apt-get update -qq
    run 900 env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    if [[ -n $MADE_POLICY ]]; then rm -f /usr/sbin/policy-rc.d; MADE_POLICY=""; fi
}

make_node() {  # the throwaway user: its home holds the venv, the Ray temp dir, authorized_keys
    useradd --create-home --shell /bin/bash "$NODE_USER" && MADE_USER=1
    usermod -p '*' "$NODE_USER"   # no password login, yet not "locked" (sshd without PAM refuses locked)
    HOME_DIR=$(getent passwd "$NODE_USER" | cut -d: -f6)
    # Every `ray up` / `ray exec` command runs as `bash --login -c -i 'source ~/.bashrc; ...'`: put the
    # node's environment first in .bashrc (before Debian's "not interactive: return")
    { echo "export RAY_TMPDIR=\$HOME/tmp TMPDIR=\$HOME/tmp RAY_USAGE_STATS_ENABLED=0"
      echo "[ ! -f \$HOME/venv/bin/activate ] || . \$HOME/venv/bin/activate"
      cat "$HOME_DIR/.bashrc"; } >"$WORK/bashrc"
    install -o "$NODE_USER" -g "$NODE_USER" -m 644 "$WORK/bashrc" "$HOME_DIR/.bashrc"
    install -d -o "$NODE_USER" -g "$NODE_USER" -m 700 "$HOME_DIR/.ssh" "$HOME_DIR/tmp"
    install -o "$NODE_USER" -g "$NODE_USER" -m 600 "$WORK/key.pub" "$HOME_DIR/.ssh/authorized_keys"
    # What a node needs before `ray up`: a Python with the same Ray as the machine running `ray up`.
    # waferrt and the model are NOT installed here: cluster.yaml's setup_commands do that.
    log "node venv: ray==$RAY_VERSION into ~$NODE_USER/venv (from PyPI)"
    as_node 900 "/usr/bin/python3 -m venv ~/venv && ~/venv/bin/pip install -q ray==$RAY_VERSION"
}

start_sshd() {  # our own sshd: 127.0.0.1 only, our host key, only the node user, keys only
    [[ -d /run/sshd ]] || { mkdir -p /run/sshd && MADE_PRIVSEP=1; }
    cat >"$WORK/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $SSH_PORT
HostKey $WORK/host_key
PidFile none
AllowUsers $NODE_USER
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
X11Forwarding no
EOF
    /usr/sbin/sshd -t -f "$WORK/sshd_config"
    /usr/sbin/sshd -D -e -f "$WORK/sshd_config" 2>"$WORK/sshd.log" 3>&- &
    SSHD_PID=$!
    wait_for 20 nc -z 127.0.0.1 "$SSH_PORT" || die "sshd did not listen on 127.0.0.1:$SSH_PORT in 20 s"
}

write_yaml() {  # the shipped cluster.yaml, overridden only where a loopback run must differ
    python3 - "$REPO/cluster.yaml" "$WORK/cluster.yaml" "$CLUSTER" "$NODE_USER" "$WORK/key" "$SSH_PORT" \
        "$GCS_PORT" "$AGENT_PORT" <<'EOF'
import sys, yaml
src, dst, cluster, user, key, ssh_port, gcs, agent = sys.argv[1:]
cfg = yaml.safe_load(open(src))
cfg["cluster_name"] = cluster
cfg["provider"].update(head_ip="127.0.0.1", worker_ips=[])
# Ray's yaml has no ssh port setting: reach our sshd's port through a proxy command
cfg["auth"] = {"ssh_user": user, "ssh_private_key": key, "ssh_proxy_command": f"nc 127.0.0.1 {ssh_port}"}
starts = cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]
if any("ray stop" in c for c in starts):
    sys.exit(f"cluster.yaml: a start command runs `ray stop` (it would stop others' Rays too): {starts}")
# The shipped head command as it is, on free ports instead of 6379 and 52365 (the node's minimal `ray` starts no
# client server on 10001) and node IP 127.0.0.2: loopback too (Ray rewrites 127.0.0.1 to the machine's outward
# address).
ours = f"--port={gcs} --node-ip-address=127.0.0.2 --dashboard-agent-listen-port={agent} --disable-usage-stats"
if not any("--port=6379" in c for c in cfg["head_start_ray_commands"]):
    sys.exit(f"cluster.yaml: no head start command with --port=6379 to run on a free port: {starts}")
cfg["head_start_ray_commands"] = [c.replace("--port=6379", ours) for c in cfg["head_start_ray_commands"]]
yaml.safe_dump(cfg, open(dst, "w"), sort_keys=False)
EOF
}

decode() {  # decode NAME FLAGS...: `waferrt generate` on the head through `ray exec`; its JSON -> NAME.json
    local name=$1 cmd; shift
    cmd="waferrt generate $(printf %q "$PROMPT") --max-new-tokens $TOKENS --json $*"
    ray_cli 900 exec "$WORK/cluster.yaml" "$cmd" --disable-usage-stats --log-style record \
        >"$WORK/$name.out" 2>&1 || { tail -30 "$WORK/$name.out" >&2; die "ray exec $cmd"; }
    tr -d '\r' <"$WORK/$name.out" | grep '^{' | tail -1 >"$WORK/$name.json" || true
    [[ -s $WORK/$name.json ]] || { tail -30 "$WORK/$name.out" >&2; die "no JSON from $cmd"; }
}

cleanup() {
    local rc=$?
    set +e
    trap - EXIT
    trap '' INT TERM PIPE   # finish cleaning up even after a 2nd Ctrl-C, or with a `| tee` that Ctrl-C ended
    if [[ -n $CHILD ]]; then  # interrupted: end the command under way (its whole process group) first
        kill -TERM -- "-$CHILD" 2>/dev/null; wait_for 20 bash -c "! kill -0 $CHILD" || kill -KILL -- "-$CHILD"
    fi
    if [[ -n $CLUSTER_UP ]]; then log "ray down"; ray_cli 180 down "$WORK/cluster.yaml" -y --log-style record >>"$WORK/down.log" 2>&1; fi
    if [[ -n $MADE_USER ]]; then
        # what is left of the node user (its Ray if `ray down` failed): ended by pid, that user's only
        wait_for 30 bash -c "! pgrep -u $NODE_USER" ||
            kill -KILL $(pgrep -u "$NODE_USER") 2>/dev/null
        wait_for 10 bash -c "! pgrep -u $NODE_USER"
        userdel -r "$NODE_USER" 2>/dev/null || log "userdel $NODE_USER failed: remove it by hand"
    fi
    if [[ -n $SSHD_PID ]]; then kill "$SSHD_PID" 2>/dev/null; wait "$SSHD_PID" 2>/dev/null; fi
    [[ -z $MADE_PRIVSEP ]] || rmdir /run/sshd
    [[ -z $MADE_POLICY ]] || rm -f /usr/sbin/policy-rc.d
    # ray's ssh ControlMaster sockets: /tmp/ray_ssh_<user hash>/<cluster hash> (hard-coded in Ray)
    if [[ -n $CONTROL_PARENT ]]; then
        rm -rf "${CONTROL_PARENT:?}/$CONTROL_HASH"; [[ -n $KEEP_PARENT ]] || rmdir "$CONTROL_PARENT" 2>/dev/null
    fi
    [[ -z ${KEEP_LOGS:-} || -z $WORK ]] || { mkdir -p "$KEEP_LOGS" && cp "$WORK"/*.log "$WORK"/*.out "$KEEP_LOGS"; }
    [[ -z $WORK ]] || rm -rf "$WORK"
    local p gone=""; for p in $RAYLETS_BEFORE; do kill -0 "$p" 2>/dev/null || gone+="$p "; done
    log "other sessions' raylets from before: ${RAYLETS_BEFORE:-none}; ended meanwhile: ${gone:-none}"
    if ((rc == 0)); then log "OK: cleaned up"; else log "exit $rc: cleaned up"; fi
    exit "$rc"
}

main() {
    [[ $(id -u) == 0 ]] || die "run as root (apt-get, useradd, sshd)"
    unset RAY_ADDRESS
    cd "$REPO"   # file_mounts "~/waferrt": "." is this checkout, as seen from where `ray up` runs
    { command -v ray && python3 -c 'import yaml'; } >/dev/null || die "needs ray and PyYAML (pip install -e .)"
    RAY_VERSION=$(ray --version | awk '{print $NF}')   # the node gets the same Ray as `ray up` here
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    WORK=$(mktemp -d /tmp/try-ray-up.XXXXXX) && mkdir "$WORK/tmp"
    CONTROL_PARENT=/tmp/ray_ssh_$(id -un | tr -d '\n' | sha256sum | cut -c1-10)   # as Ray's command_runner.py
    CONTROL_HASH=$(printf %s "$CLUSTER" | sha256sum | cut -c1-10)
    [[ ! -e $CONTROL_PARENT ]] || KEEP_PARENT=1
    RAYLETS_BEFORE=$({ pgrep -x raylet || true; } | tr '\n' ' ')   # (pgrep fails when there is none)
    log "raylets on this machine before (other sessions'): ${RAYLETS_BEFORE:-none}"

    local t0=$SECONDS; install_packages
    ssh-keygen -q -t ed25519 -N '' -C try-ray-up -f "$WORK/key"   # the throwaway key `ray up` uses
    ssh-keygen -q -t ed25519 -N '' -C try-ray-up -f "$WORK/host_key"
    make_node
    SSH_PORT=$(free_port 2222) GCS_PORT=$(free_port 6380) AGENT_PORT=$(free_port 52401)
    start_sshd
    write_yaml
    local t_prep=$((SECONDS - t0)); t0=$SECONDS
    log "ray up (node $NODE_USER@127.0.0.1:$SSH_PORT, GCS port $GCS_PORT)"
    CLUSTER_UP=1
    ray_cli 1200 up "$WORK/cluster.yaml" -y --no-config-cache --disable-usage-stats --log-style record \
        >"$WORK/up.log" 2>&1 || { tail -40 "$WORK/up.log" >&2; die "ray up"; }
    local t_up=$((SECONDS - t0)); t0=$SECONDS
    # the node's own $RAY_TMPDIR (expanded there): where --address auto looks first
    # shellcheck disable=SC2016
    ray_cli 120 exec "$WORK/cluster.yaml" 'cat "$RAY_TMPDIR/ray/ray_current_cluster"; echo' --log-style record \
        >"$WORK/addr.out" 2>&1 || die "ray exec cat ray_current_cluster"
    local addr; addr=$(tr -d '\r' <"$WORK/addr.out" | grep -E '^[0-9.]+:[0-9]+$' | tail -1) || true
    [[ $addr == "127.0.0.2:$GCS_PORT" ]] || die "--address auto on the head would join '$addr', not 127.0.0.2:$GCS_PORT"
    log "--address auto on the head = $addr (this cluster)"
    log "ray exec: waferrt generate --address auto (the wafer on the cluster)"
    decode wafer --address auto
    local t_wafer=$((SECONDS - t0)); t0=$SECONDS
    log "ray exec: waferrt generate --reference"
    decode reference --reference
    local t_ref=$((SECONDS - t0))
    python3 - "$WORK/wafer.json" "$WORK/reference.json" <<'EOF' || die "wafer tokens != reference tokens"
import json, sys
wafer, ref = (json.load(open(path)) for path in sys.argv[1:])
print(f"wafer:     {wafer['tokens']} {wafer['text']!r}\nreference: {ref['tokens']} {ref['text']!r}")
sys.exit(0 if wafer["tokens"] == ref["tokens"] and len(ref["tokens"]) > 0 else 1)
EOF
    log "tokens equal. times: prepare ${t_prep}s, ray up ${t_up}s, wafer decode ${t_wafer}s, reference ${t_ref}s"
}

main "$@"
