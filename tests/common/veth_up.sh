# Sets up the veth pair of tests/common/wire.rs (which reads this file) and
# tests/guest/rping_cmatose_interop.sh: uvwa (169.254.30.1, rxe_wa) and uvwb (169.254.30.2,
# rxe_wb), both in the initial namespace, with policy routing that sends the traffic for each
# address out of the other end's veth. Undone by veth_down.sh.
set -e
modprobe veth
ip link add uvwa type veth peer name uvwb
ip addr add 169.254.30.1/32 dev uvwa; ip addr add 169.254.30.2/32 dev uvwb
for i in all default uvwa uvwb; do sysctl -qw net.ipv4.conf.$i.rp_filter=0 net.ipv4.conf.$i.accept_local=1; done
sysctl -qw net.ipv4.conf.uvwa.arp_ignore=1 net.ipv4.conf.uvwb.arp_ignore=1
ip link set uvwa up; ip link set uvwb up
ip rule add pref 1000 lookup local; ip rule del pref 0 lookup local
ip rule add pref 100 iif uvwa lookup local; ip rule add pref 100 iif uvwb lookup local
ip rule add pref 200 to 169.254.30.2 lookup 200; ip route add 169.254.30.2 dev uvwa src 169.254.30.1 table 200
ip rule add pref 200 to 169.254.30.1 lookup 201; ip route add 169.254.30.1 dev uvwb src 169.254.30.2 table 201
rdma link add rxe_wa type rxe netdev uvwa; rdma link add rxe_wb type rxe netdev uvwb
