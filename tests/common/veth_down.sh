# Tears down what veth_up.sh set up (each step may fail when there is nothing to undo).
rdma link delete rxe_wa; rdma link delete rxe_wb; ip link del uvwa
ip rule del pref 100; ip rule del pref 100; ip rule del pref 200; ip rule del pref 200
ip route flush table 200; ip route flush table 201
ip rule show pref 0 | grep -q . || ip rule add pref 0 lookup local
ip rule del pref 1000
