# poll_until, for the guest scripts that wait for a server to listen (lib/pairs.sh,
# rc_pingpong_interop.sh), which source it: `. "$(dirname "$0")/lib/poll.sh"`. Not run by
# itself (not executable, and not directly in tests/guest/).

# poll_until SECONDS PID COMMAND...: runs COMMAND every 0.1 s until it succeeds (returns 0),
# process PID has ended or SECONDS have passed (returns 1).
poll_until() {
    poll_limit=$(($1 * 10)) poll_pid=$2
    shift 2
    poll_n=0
    while [ "$poll_n" -lt "$poll_limit" ]; do
        if "$@"; then
            return 0
        fi
        kill -0 "$poll_pid" 2>/dev/null || return 1
        sleep 0.1
        poll_n=$((poll_n + 1))
    done
    return 1
}
