package slot

// PrefixOf is prefixOf, for the external tests' library baselines
// (startcost_bench_test.go), which read the host through
// vishvananda/netlink's *net.IPNet as the code did before.
var PrefixOf = prefixOf

// EchoIn is echoIn, for the external tests that reach a slot's workload.
var EchoIn = echoIn
